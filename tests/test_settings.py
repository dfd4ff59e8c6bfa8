"""One declaration per launch setting (helpers.settings): do launch, Cluster and the magics take
every setting from LaunchSettings' fields, and does a new field reach all of them with no other edit?

Nothing here starts a rank: Cluster is made with start=False. Run alone: well under 10 s.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import Cluster, launch
from helpers.magics import DistributedMagics
from helpers.settings import SCOPES, LaunchSettings, setting, setting_arguments, takes_settings

ROOT = Path(__file__).resolve().parents[1]


def _keyword_defaults(fn) -> dict:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def test_launch_signature_lists_every_launch_setting_with_its_default():
    """Does inspect.signature(launch) (what launch?, help() and tab completion read) list each setting, keyword-only, with the field's default?"""
    params = inspect.signature(launch).parameters
    assert list(params)[:3] == ["fn", "world_size", "args"]
    defaults = _keyword_defaults(launch)
    for f in dataclasses.fields(LaunchSettings):
        if "launch" in f.metadata["used_by"] and f.name != "world_size":
            assert defaults[f.name] == f.default, f.name
    assert {"backend", "nnodes", "timeout", "init", "output", "max_lines", "trace", "forbid", "kwargs"} == set(defaults)
    assert "view" not in params  # a setting of persistent ranks only
    assert "timeout: float | None, default None" in launch.__doc__
    assert LaunchSettings.help("forbid").split(".")[0] in " ".join(launch.__doc__.split())


def test_cluster_signature_lists_its_settings_and_its_own_arguments():
    """Does inspect.signature(Cluster) show world_size=2, start, and every setting persistent ranks take?"""
    params = inspect.signature(Cluster).parameters
    assert params["world_size"].default == 2 and params["start"].default is True
    assert set(_keyword_defaults(Cluster)) == {"start", *LaunchSettings.names("cluster")} - {"world_size"}
    assert params["after_failure"].default == 2.0 and params["view"].default == "auto"
    assert "init" not in params and "trace" not in params
    assert "after_failure: float, default 2.0" in Cluster.__doc__


def test_every_existing_way_of_calling_still_builds_the_same_settings():
    """Do positional launch arguments, Cluster keywords and the old LaunchSettings constructor keep working?"""
    c = Cluster(4, backend="gloo", timeout=5, forbid=["all_reduce"], start=False)
    assert (c.world_size, c.backend, c.timeout, c.forbid) == (4, "gloo", 5.0, {"all_reduce": "this launch switched it off"})
    assert c.settings == LaunchSettings(4, backend="gloo", timeout=5, forbid=["all_reduce"])
    assert (c.view, c.after_failure, c.nnodes, c.max_lines, c.output) == ("auto", 2.0, 1, 1000, "live")
    assert not c.running
    made = LaunchSettings(2, backend="gloo", nnodes=2, timeout=3, init=False, output="quiet", trace=True, forbid={})
    assert made == LaunchSettings.of(2, "launch", backend="gloo", nnodes=2, timeout=3, init=False, output="quiet",
                                     trace=True, forbid={})
    assert Cluster(**made.replace(view="text").given("cluster"), start=False).settings == made.replace(
        view="text", init=True, trace=False)
    inspect.signature(launch).bind(lambda rank, world_size, x: x, 4, (1,), timeout=3, kwargs={})


@pytest.mark.parametrize("make, words", [
    (lambda: launch(print, 2, timout=3), "launch() takes no setting 'timout' (did you mean 'timeout'?)"),
    (lambda: launch(print, 2, view="text"), "launch() takes no setting 'view': only Cluster() takes it"),
    (lambda: Cluster(2, trace=True, start=False), "Cluster() takes no setting 'trace': only launch() and %%distributed"),
    (lambda: Cluster(2, colour="red", start=False), "Cluster() takes no setting 'colour'. Its settings: backend,"),
    (lambda: LaunchSettings.of(2, max_line=3), "LaunchSettings takes no setting 'max_line' (did you mean 'max_lines'?)"),
    (lambda: LaunchSettings.help("nodes"), "did you mean 'nnodes'?"),
])
def test_an_unknown_setting_is_a_type_error_naming_the_known_ones(make, words):
    """Does a misspelt or misplaced setting raise TypeError naming it, a close match, and what is taken instead?"""
    with pytest.raises(TypeError) as info:
        make()
    assert words in str(info.value), str(info.value)


def test_bad_values_are_checked_by_their_field_before_anything_starts():
    """Do the fields' checks (now also view and after_failure) raise ValueError naming the value, for every caller?"""
    for make, words in ((lambda: Cluster(2, view="tabs", start=False), "view='tabs'"),
                        (lambda: Cluster(2, after_failure=-1, start=False), "after_failure must be seconds"),
                        (lambda: launch(print, 0), "world_size must be a whole number"),
                        (lambda: LaunchSettings.checked("timeout", 0), "timeout must be a positive number")):
        with pytest.raises(ValueError, match=words):
            make()


def test_the_magics_options_come_from_the_fields():
    """Does %dist_start take every Cluster setting as --name (type, default and help from the field), and
    %%distributed the settings of one cell, with the old command lines still parsing?"""
    from IPython.core.magic_arguments import parse_argstring

    args = parse_argstring(DistributedMagics.dist_start, "-n 4 --backend gloo --nnodes 2 --timeout 30 --view text")
    assert vars(args) == {"world_size": 4, "backend": "gloo", "nnodes": 2, "timeout": 30.0, "output": "live",
                          "max_lines": 1000, "forbid": (), "view": "text", "after_failure": 2.0}
    assert parse_argstring(DistributedMagics.dist_start, "--forbid all_reduce,broadcast").forbid == [
        "all_reduce", "broadcast"]
    for name in LaunchSettings.names("cluster"):
        flag = "--" + name.replace("_", "-")
        assert flag in DistributedMagics.dist_start.__doc__, flag
    assert LaunchSettings.help("after_failure").split(";")[0] in " ".join(DistributedMagics.dist_start.__doc__.split())
    cell = parse_argstring(DistributedMagics.distributed, "--ranks 0,2 --timeout 3 --trace")
    assert (cell.ranks, cell.timeout, cell.trace) == ("0,2", 3.0, True)
    assert vars(parse_argstring(DistributedMagics.distributed, "")) == {"ranks": None, "timeout": None, "trace": False}


@dataclasses.dataclass(frozen=True)
class WithSeed(LaunchSettings):
    """LaunchSettings plus one new field, declared the one way a setting is."""

    seed: int = setting(0, used_by=("launch", "cluster"), help="The seed every rank starts its random generators with.")


def test_a_new_setting_is_one_declaration():
    """Does one setting() reach the signature, the docstring, the checks of unknown names and the magic's options,
    with no other edit?"""

    @takes_settings("launch", WithSeed)
    def run_it(fn, world_size, args=(), **settings):
        """Run it.

        {settings}
        """
        return WithSeed.of(world_size, "launch", **settings)

    assert _keyword_defaults(run_it)["seed"] == 0
    assert "seed: int, default 0" in run_it.__doc__ and "random generators" in run_it.__doc__
    assert run_it(print, 2, seed=7).seed == 7
    with pytest.raises(TypeError, match="did you mean 'seed'"):
        run_it(print, 2, sed=7)
    options = {keywords["dest"]: (flags, keywords) for flags, keywords in setting_arguments("cluster", settings=WithSeed)}
    assert options["seed"][0] == ("--seed",) and options["seed"][1]["type"] is int
    assert "seed" not in LaunchSettings.names() and "seed" in WithSeed.names("cluster")


def test_scopes_and_fields_agree():
    """Is every field used by at least one known scope, with help text, and can each scope's options be built?"""
    for f in dataclasses.fields(LaunchSettings):
        assert f.metadata["used_by"] and set(f.metadata["used_by"]) <= set(SCOPES), f.name
        assert LaunchSettings.help(f.name), f.name
    for scope in SCOPES:
        assert setting_arguments(scope)
    with pytest.raises(ValueError, match="used_by"):
        setting(1, help="x", used_by=("lunch",))


def test_tab_completion_offers_the_settings():
    """In IPython, does completing inside launch( and Cluster( offer timeout= and after_failure=?"""
    code = (  # helpers first, before there is a shell: this process only completes names, it runs no ranks
        "import helpers\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "shell = InteractiveShell.instance(); shell.Completer.use_jedi = False\n"
        "shell.run_cell('from helpers import launch, Cluster')\n"
        "print(shell.complete('tim', 'launch(f, 2, tim', 16)[1])\n"
        "print(shell.complete('after', 'Cluster(2, after', 16)[1])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    launch_line, cluster_line = done.stdout.splitlines()[-2:]
    assert "'timeout='" in launch_line and "'after_failure='" in cluster_line, done.stdout


def test_forbidden_call_error_carries_its_family_through_pickling():
    """Does ForbiddenCallError keep family and name (what grading words its feedback on) across pickling?"""
    import pickle

    from helpers._runtime.calls import FAMILIES, family_of

    err = helpers.ForbiddenCallError("helpers.ring.ring_allreduce", "write your own", family_of(helpers.COURSE_RING),
                                     helpers.COURSE_RING)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.family, copy.name, copy.call, copy.reason) == ("course_ring", "helpers.ring",
                                                                 "helpers.ring.ring_allreduce", "write your own")
    assert [family_of(n) for n in ("all_reduce", "barrier", "irecv", helpers.DDP)] == [
        "collective", "collective", "point_to_point", "ddp"]
    assert set(FAMILIES) == {family_of(n) for n in (*helpers.COLLECTIVES, *helpers.POINT_TO_POINT, *helpers.APIS)}
    assert [family_of(n) for n in (helpers.ZERO, helpers.FSDP, helpers.DTENSOR, helpers.PIPELINING)] == [
        "zero", "fsdp", "dtensor", "pipelining"]
