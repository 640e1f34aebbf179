"""``retold``: a shared option in a command's own words, the shared declaration untouched."""
from __future__ import annotations

from typing import get_args

from kvmesh.ops import cli_options as opt


def test_retold_keeps_the_flag_and_its_variable_and_leaves_the_original_alone():
    before = get_args(opt.ServiceToken)[1].help
    kind, info = get_args(opt.retold(opt.ServiceToken, "--token", help="mine"))
    _, shared = get_args(opt.ServiceToken)
    assert kind == str | None and info.help == "mine" and shared.help == before
    assert info.envvar == shared.envvar == "KVMESH_WORKER_TOKEN"
    assert info.default == shared.default == "--service-token"
    assert info.param_decls == (*shared.param_decls, "--token")
