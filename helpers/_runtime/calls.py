"""The torch.distributed calls the helpers know, by name, each with one record of what it is.

:data:`KNOWN` maps every call the ranks' wrappers watch to its :class:`CallInfo`: its
family (point-to-point or collective), which parameter holds the tensor that says how many
bytes move, whether it reduces, the process-group methods and functional collectives that do
the same work (switched off with it), and its colour in trace pictures. Everything else here
is read from that one table: :data:`POINT_TO_POINT`, :data:`COLLECTIVES` and
:data:`DATA_COLLECTIVES` (every collective that moves data, the set an exercise switches off
when it asks for a hand-made one), the names ``forbid`` accepts besides them (:data:`DDP`,
:data:`COURSE_RING`), the family a switched-off call belongs to (:func:`family_of`, the
``family`` of :class:`~helpers.ForbiddenCallError`), and :data:`CALLS`: every call a rank
notes on the board (:mod:`helpers._runtime.board`), in the order it stores them.

    >>> "all_reduce" in DATA_COLLECTIVES, "barrier" in DATA_COLLECTIVES
    (True, False)
    >>> KNOWN["all_gather_into_tensor"].tensor, family_of("isend"), family_of(COURSE_RING)
    ('input_tensor', 'point_to_point', 'course_ring')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallInfo", "KNOWN", "POINT_TO_POINT", "COLLECTIVES", "DATA_COLLECTIVES", "DDP", "COURSE_RING",
           "DDP_CONSTRUCTOR", "CALLS", "FORBIDDEN_ALIASES", "NOT_COMMUNICATION", "PUBLIC_FUNCTIONS", "FAMILIES",
           "family_of"]

#: The families a switched-off call can belong to (:attr:`helpers.ForbiddenCallError.family`).
FAMILIES = ("collective", "point_to_point", "ddp", "course_ring")
_P2P, _COLLECTIVE = "point_to_point", "collective"


@dataclass(frozen=True)
class CallInfo:
    """What the helpers know about one torch.distributed call."""

    family: str  # "point_to_point" or "collective"
    tensor: str | None = None  # the parameter whose tensor says how many bytes move (None: the first one)
    reduces: bool = False  # takes a reduce ``op`` (a trace notes which)
    aliases: tuple[str, ...] = ()  # process-group methods / functional collectives doing the same work
    color: str | None = None  # its colour in trace pictures (None: the family's)


def _p2p(color: str | None = None) -> CallInfo:
    return CallInfo(_P2P, color=color)


def _coll(tensor: str | None = None, *aliases: str, reduces: bool = False, color: str | None = None) -> CallInfo:
    return CallInfo(_COLLECTIVE, tensor, reduces, aliases, color)


_SCATTER_SINGLE = ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single")
_GATHER_SINGLE = ("_allgather_base", "allgather_into_tensor_coalesced", "all_gather_single")

#: Every call the ranks' wrappers watch, in the order the board numbers them: the
#: point-to-point calls, then the collectives (the newer names are wrapped only where the
#: installed torch has them).
KNOWN: dict[str, CallInfo] = {
    "send": _p2p("#1f77b4"),
    "recv": _p2p("#ff7f0e"),
    "isend": _p2p("#6baed6"),
    "irecv": _p2p("#fdae6b"),
    "batch_isend_irecv": _p2p(),
    "send_object_list": _p2p(),
    "recv_object_list": _p2p(),
    "broadcast": _coll(None, "broadcast", color="#9467bd"),
    "all_reduce": _coll(None, "allreduce", "allreduce_coalesced", reduces=True, color="#2ca02c"),
    "reduce": _coll(None, "reduce", reduces=True),
    "all_gather": _coll("tensor", "allgather", "allgather_coalesced", "_allgather_base", "all_gather_single"),
    "all_gather_into_tensor": _coll("input_tensor", *_GATHER_SINGLE),
    "gather": _coll("tensor", "gather", "gather_single", "gather_into_tensor"),
    "scatter": _coll("scatter_list", "scatter"),
    "reduce_scatter": _coll("input_list", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
                            reduces=True),
    "reduce_scatter_tensor": _coll("input", *_SCATTER_SINGLE, reduces=True),
    "all_to_all": _coll("input_tensor_list", "alltoall", "alltoall_base", "all_to_all_single"),
    "all_to_all_single": _coll("input", "alltoall_base", "all_to_all_single"),
    "barrier": _coll(None, "barrier", "monitored_barrier", color="#7f7f7f"),
    "monitored_barrier": _coll(),
    "broadcast_object_list": _coll(),
    "all_gather_object": _coll(),
    "gather_object": _coll(),
    "scatter_object_list": _coll(),
    "_all_gather_base": _coll("input_tensor"),
    "_reduce_scatter_base": _coll("input"),
    "all_gather_single": _coll("input_tensor", *_GATHER_SINGLE),  # the successor of all_gather_into_tensor
    "reduce_scatter_single": _coll("input", *_SCATTER_SINGLE, reduces=True),  # ... of reduce_scatter_tensor
    "all_reduce_coalesced": _coll("tensors", "allreduce_coalesced", reduces=True),
    "all_gather_coalesced": _coll("input_tensor_list", "allgather_coalesced"),
    "gather_single": _coll(None, "gather_single", "gather_into_tensor"),  # torch 2.14: gather into one tensor on dst
    "gather_into_tensor": _coll(None, "gather_single", "gather_into_tensor"),  # torch 2.14's deprecated name for it
}

POINT_TO_POINT = tuple(name for name, info in KNOWN.items() if info.family == _P2P)
COLLECTIVES = tuple(name for name, info in KNOWN.items() if info.family == _COLLECTIVE)
#: Every collective that moves data (all but the barriers): what an exercise that builds
#: its own collective switches off. The object collectives are in it: they call the others.
DATA_COLLECTIVES = tuple(c for c in COLLECTIVES if c not in ("barrier", "monitored_barrier"))
#: Pass this name in ``forbid`` to switch off ``torch.nn.parallel.DistributedDataParallel``.
DDP = "DistributedDataParallel"
#: Pass this name in ``forbid`` to switch off the course's own ring all-reduce (``helpers.ring``,
#: which lesson 8 teaches): an exercise that asks for a ring must not be answered by calling it.
COURSE_RING = "helpers.ring"
#: What DistributedDataParallel's constructor is noted as on the board while it runs: it
#: broadcasts rank 0's weights from C++, a collective every rank of the group must join.
DDP_CONSTRUCTOR = "DistributedDataParallel"
#: Every call a rank notes on the board (its index is what the board stores).
CALLS = POINT_TO_POINT + COLLECTIVES + ("wait", DDP_CONSTRUCTOR)

#: Process-group methods and functional collectives that do the same work as a public
#: collective; forbidding the collective forbids these too.
FORBIDDEN_ALIASES = {name: info.aliases for name, info in KNOWN.items() if info.aliases}


def family_of(name: str) -> str:
    """The family (one of :data:`FAMILIES`) of a name ``forbid`` accepts."""
    if name == DDP:
        return "ddp"
    if name == COURSE_RING:
        return "course_ring"
    return KNOWN[name].family


#: Public torch.distributed functions that move no data between ranks, so nothing wraps
#: them: setting groups up and down, asking about them, and context managers. Every other
#: public function of the installed torch.distributed must be in
#: :data:`~helpers._runtime.calls.POINT_TO_POINT` or :data:`~helpers._runtime.calls.COLLECTIVES`
#: (tests/test_trace.py checks it, so a collective added by a new torch is not missed).
NOT_COMMUNICATION = (
    "init_process_group",
    "destroy_process_group",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "split_group",
    "shrink_group",
    "init_device_mesh",
    "is_available",
    "is_initialized",
    "is_torchelastic_launched",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_ucc_available",
    "is_xccl_available",
    "get_backend",
    "get_backend_config",
    "get_default_backend_for_device",
    "get_rank",
    "get_world_size",
    "get_group_rank",
    "get_global_rank",
    "get_process_group_ranks",
    "get_node_local_rank",
    "get_pg_count",
    "get_debug_level",
    "supports_complex",
    "GroupName",
    "record_comm",  # a context manager that names the collectives run inside it
    "rendezvous",  # the store behind init_process_group, not the backend
    "register_rendezvous_handler",
    "breakpoint",  # a debugger for one rank
    "get_backend_impl",  # torch 2.14: the group's backend object, to call its own methods
    "set_timeout",  # torch 2.14: a group's timeout for later calls
)

#: Every public function of torch.distributed the helpers know (tests/test_trace.py keeps the
#: list complete for the installed torch): what a hang report looks for on a rank's stack
#: when the board does not say which call the rank is in (:func:`helpers._runtime.diagnose.describe_wait`).
PUBLIC_FUNCTIONS = frozenset(KNOWN) | frozenset(NOT_COMMUNICATION)
