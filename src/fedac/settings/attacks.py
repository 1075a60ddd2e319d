"""The attack registry (`attack.kind`) and each attack's own settings.

An attack's settings are a dataclass here; its registry entry names it (`Entry(..., settings=...)`)
and `Config` adds its fields to the `attack` section (`--set attack.noise_std=2`), beside the shared
`kind`, `fraction` and `measure_backdoor` (config.py). The attacks themselves
(fedac/rules/attacks.py) load only when a run uses one, and describe themselves by their docstrings
(`fedac list`): this module imports no torch, so a name or a setting is checked when the config
loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedac.fields import number
from fedac.registry import Entry, Registry, choice


@dataclass
class TargetSettings:
    target: int = number(0, ">= 0")
    """Target class of label_flip and backdoor."""


@dataclass
class BackdoorSettings(TargetSettings):
    poison_ratio: float = number(0.5, "(0, 1]")
    """backdoor: share of a malicious client's training clips that carry the trigger."""
    trigger: str = choice("tone", ("tone", "click"))
    """backdoor trigger: tone (a sine burst) or click (an impulse train)."""
    trigger_amplitude: float = number(0.1, ">= 0")
    """Trigger peak relative to the clip's peak amplitude."""
    trigger_seconds: float = number(0.1, "> 0")
    """Trigger length, placed at the start of the clip."""
    trigger_hz: float = number(4000.0, "> 0")
    """Tone frequency, or clicks per second for the click trigger."""


@dataclass
class GaussianSettings:
    noise_std: float = number(1.0, ">= 0")
    """gaussian: standard deviation of the noise sent in place of the update, per coordinate."""


@dataclass
class ScaleSettings:
    boost: float | None = number(None, "finite")
    """scale: factor on the update; None: cohort size / malicious clients in it (Bagdasaryan et
    al.'s model replacement with server learning rate 1)."""


@dataclass
class LittleSettings:
    z: float | None = number(None, "finite")
    """little: shift in per-coordinate standard deviations; None: Baruch et al. 2019's z_max from
    the cohort size and malicious count."""


def _attack(cls: str, settings: type | None = None) -> Entry:
    # described by the class's docstring
    return Entry(f"fedac.rules.attacks:{cls}", settings=settings)


#: The attack registry (fedac/registry.py): built-ins here, plug-ins from the `fedac.attacks` entry
#: points. fedac.rules.attacks re-exports it.
ATTACKS = Registry(
    "attack",
    {
        "none": _attack("NoAttack"),
        "label_flip": _attack("LabelFlip", TargetSettings),
        "label_permute": _attack("LabelPermute"),
        # attack.measure_backdoor triggers clips under any kind: the trigger's settings are always
        # in the section
        "backdoor": _attack("Backdoor", BackdoorSettings),
        "sign_flip": _attack("SignFlip"),
        "gaussian": _attack("Gaussian", GaussianSettings),
        "scale": _attack("Scale", ScaleSettings),
        "little": _attack("Little", LittleSettings),
    },
    setting="attack.kind",
)
