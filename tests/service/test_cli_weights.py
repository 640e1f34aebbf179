"""``kvmesh service --cost-weight NAME=VALUE`` and ``--route-log``: flags into ServiceConfig."""
from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from service.cli import config_of, register
from service.config import CostWeights, parse_cost_weights

NONE = dict(token=None, worker_token=None, worker_secret=None)


def _invoke(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    register(app)
    app.command("other")(lambda: None)  # a second command: "service" is a subcommand
    res = CliRunner().invoke(app, ["service", *args])
    return res.exit_code, res.output


def test_cost_weights_fold_into_the_config() -> None:
    cfg = config_of("auto", None, cost_weight=["saturation_weight=0", "wait_weight=0.5",
                                               "saturation_weight=0.25"], **NONE)
    assert cfg.weights == CostWeights(saturation_weight=0.25, wait_weight=0.5)
    assert config_of("auto", None, **NONE).weights == CostWeights()
    # the credit flags keep working, beside the weights
    cfg = config_of("auto", None, cpu_credit=0.7, cost_weight=["queue_weight=2"], **NONE)
    assert (cfg.weights.cpu_credit, cfg.weights.queue_weight) == (0.7, 2.0)
    cfg = config_of("auto", None, cost_weight=["disk_credit=0.1"], **NONE)
    assert cfg.weights.disk_credit == 0.1


@pytest.mark.parametrize("items, error", [
    (["bogus=1"], "NAME one of prefill_weight, queue_weight"),
    (["saturation_weight"], "expected NAME=VALUE"),
    (["queue_weight=fast"], "'fast' is not a number"),
])
def test_a_bad_weight_names_the_valid_ones(items: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_cost_weights(items)


def test_the_command_refuses_bad_weights_as_usage_errors() -> None:
    code, out = _invoke("--cost-weight", "bogus=1")
    assert code == 2 and "saturation_weight" in out and "bogus" in out
    code, out = _invoke("--cost-weight", "wait_weight=-1")
    assert code == 2 and "wait_weight must be >= 0" in out
    code, out = _invoke("--cpu-credit", "0.5", "--cost-weight", "cpu_credit=0.2")
    assert code == 2 and "both set" in out
    code, out = _invoke("--help")
    assert code == 0 and "--cost-weight" in out and "--route-log" in out


def test_route_log_is_a_config_field_off_by_default(tmp_path) -> None:
    assert config_of("auto", None, **NONE).route_log is None
    path = str(tmp_path / "r.jsonl")
    assert config_of("auto", None, route_log=path, **NONE).route_log == path
