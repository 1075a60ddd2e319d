"""`train.paper_optimizer` (settings/paper.py): each algorithm's paper's local optimiser and
aggregation weights under the run's own settings; off, nothing changes."""

import pytest

from fedac.config import load_config, save_config
from fedac.settings.algorithms import ALGORITHMS
from fedac.settings.paper import PAPER


def test_off_by_default_the_shared_defaults_stay():
    for name in ("fedavg", "moon", "fedrep", "ditto"):
        cfg = load_config(None, [], algorithm=name)
        assert not cfg.train.paper_optimizer
        assert (cfg.train.momentum, cfg.aggregation.weighting) == (0.9, "n_k")


@pytest.mark.parametrize("name", sorted(PAPER))
def test_on_each_algorithm_runs_its_papers_declaration(name, tmp_path):
    assert name in ALGORITHMS
    cfg = load_config(None, ["train.paper_optimizer=true"], algorithm=name)
    declared = PAPER[name][0]
    for key, value in declared.items():
        section, field = key.split(".")
        assert getattr(getattr(cfg, section), field) == value, key
    # config.yaml repeats it
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_the_runs_own_settings_win_and_undeclared_methods_keep_theirs():
    cfg = load_config(None, ["train.paper_optimizer=true", "train.momentum=0.5"], algorithm="moon")
    assert (cfg.train.momentum, cfg.train.weight_decay) == (0.5, 1e-5)
    plain = load_config(None, [], algorithm="fedmlac")
    paper = load_config(None, ["train.paper_optimizer=true"], algorithm="fedmlac")
    assert paper.train == type(paper.train)(**{**vars(plain.train), "paper_optimizer": True})
    moon = load_config(None, ["train.paper_optimizer=true"], algorithm="moon")
    assert (moon.train.momentum, moon.aggregation.weighting) == (0.9, "n_k")
    fedrep = load_config(None, ["train.paper_optimizer=true"], algorithm="fedrep")
    assert (fedrep.train.momentum, fedrep.aggregation.weighting) == (0.0, "uniform")
