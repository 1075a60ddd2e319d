"""The parts of a network that personalised FL methods keep on the client or share: its **head**
(the final classifier), its **body** (everything before it: the representation) and its
**BatchNorm** entries, defined here once for every model family (algorithms/partial.py reads them).

- CRNNs (`crnn_*`, models/crnn.py): head `head.*`, the linear classifier over the pooled GRU
  states; body the conv blocks and the GRU; no BatchNorm.
- KWS nets (`dscnn`, `mhattrnn`, `resnet15`, `kwt`; models/kws.py): head `head.*`, the linear
  classifier; body the rest; BatchNorm in `dscnn`, `mhattrnn` and `resnet15`, none in `kwt`
  (LayerNorm).
- KWS CNNs (`cnn*`, `dscnn3_relu`, `ann3_relu`; models/kws_cnn.py): head `head.*`, body `body.*`;
  no BatchNorm.
- SSL encoders (`w2v2_*`, models/ssl.py): head `head.*` over the pooled encoder states, body the
  encoder; no BatchNorm (LayerNorm).

Every zoo network names its classifier `head`, so the rule is one: the head is the entries of the
module `head`. A plug-in network is split the same way when it has a module named `head`, and
refused (naming the model) when it has none. The BatchNorm entries are those of every
`nn.BatchNorm*` module: weight, bias, running mean and variance, batch count.
"""

from __future__ import annotations

from torch import nn

from fedac.errors import ConfigError

#: The module every zoo network's final classifier is named.
HEAD = "head"


def entry_names(model: nn.Module) -> list[str]:
    """Every state entry (parameters and buffers), in `state_dict` order."""
    return list(model.state_dict().keys())


def head_entries(model: nn.Module, name: str) -> set[str]:
    """The entries of the model's classifier (`head.*`); `name` names the model in the error."""
    heads = {n for n in entry_names(model) if n.startswith(f"{HEAD}.")}
    if not heads:
        raise ConfigError(
            f"model {name} has no module named '{HEAD}', so its head and body are not defined "
            "(models/parts.py): name its final classifier `head`, or choose a zoo model"
        )
    return heads


def body_entries(model: nn.Module, name: str) -> set[str]:
    """Every entry that is not the head's."""
    return set(entry_names(model)) - head_entries(model, name)


def batchnorm_entries(model: nn.Module) -> set[str]:
    """The parameters and statistics of every BatchNorm layer (empty for a network without one)."""
    return {
        f"{module_name}.{entry}"
        for module_name, module in model.named_modules()
        if isinstance(module, nn.modules.batchnorm._BatchNorm)
        for entry in module.state_dict()
    }
