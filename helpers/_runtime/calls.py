"""The torch.distributed calls the helpers know, by name, each with one record of what it is.

:data:`KNOWN` maps every call the ranks' wrappers watch to its :class:`CallInfo`: its
family (point-to-point or collective), which parameter holds the tensor that says how many
bytes move, whether it reduces, the process-group methods and functional collectives that do
the same work (switched off with it), and its colour in trace pictures. Everything else here
is read from that one table: :data:`POINT_TO_POINT`, :data:`COLLECTIVES` and
:data:`DATA_COLLECTIVES` (every collective that moves data, the set an exercise switches off
when it asks for a hand-made one), the names ``forbid`` accepts besides them (:data:`APIS`:
whole APIs such as :data:`DDP`, :data:`FSDP` or :data:`COURSE_RING`), the family a
switched-off call belongs to (:func:`family_of`, the ``family`` of
:class:`~helpers.ForbiddenCallError`), and :data:`CALLS`: every call a rank notes on the
board (:mod:`helpers._runtime.board`), in the order it stores them.

Collectives made below the public functions are named here too, each as the public call
doing the same work (the ``op`` of its trace event): :data:`PROCESS_GROUP_METHODS` (a
``ProcessGroup``'s own methods, called directly) and :data:`FUNCTIONAL_OPS` (the functional
collectives ``torch.ops._c10d_functional.*`` that DTensor, tensor parallelism and
``torch.compile`` use), with :data:`FUNCTIONAL_ENTRY_POINTS`, the Python functions of
``torch.distributed._functional_collectives`` that reach them.

    >>> "all_reduce" in DATA_COLLECTIVES, "barrier" in DATA_COLLECTIVES
    (True, False)
    >>> KNOWN["all_gather_into_tensor"].tensor, family_of("isend"), family_of(COURSE_RING), family_of(FSDP)
    ('input_tensor', 'point_to_point', 'course_ring', 'fsdp')
    >>> PROCESS_GROUP_METHODS["_allgather_base"], FUNCTIONAL_OPS["all_gather_into_tensor_out"]
    (('all_gather_into_tensor', 1), 'all_gather_into_tensor')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CallInfo", "KNOWN", "POINT_TO_POINT", "COLLECTIVES", "DATA_COLLECTIVES", "DDP", "COURSE_RING",
           "ZERO", "FSDP", "DTENSOR", "PIPELINING", "APIS", "DDP_CONSTRUCTOR", "CALLS", "FORBIDDEN_ALIASES",
           "FORBIDDEN_FUNCTIONAL", "PROCESS_GROUP_METHODS", "FUNCTIONAL_OPS", "FUNCTIONAL_ENTRY_POINTS",
           "NOT_COMMUNICATION", "PUBLIC_FUNCTIONS", "FAMILIES", "family_of"]
_P2P, _COLLECTIVE = "point_to_point", "collective"


@dataclass(frozen=True)
class CallInfo:
    """What the helpers know about one torch.distributed call."""

    family: str  # "point_to_point" or "collective"
    tensor: str | None = None  # the parameter whose tensor says how many bytes move (None: the first one)
    reduces: bool = False  # takes a reduce ``op`` (a trace notes which)
    aliases: tuple[str, ...] = ()  # process-group methods doing the same work (switched off with it)
    color: str | None = None  # its colour in trace pictures (None: the family's)
    functional: tuple[str, ...] = ()  # functional collectives (FUNCTIONAL_OPS) doing the same work


def _p2p(color: str | None = None, functional: tuple[str, ...] = ()) -> CallInfo:
    return CallInfo(_P2P, color=color, functional=functional)


def _coll(tensor: str | None = None, *aliases: str, reduces: bool = False, color: str | None = None,
          functional: tuple[str, ...] = ()) -> CallInfo:
    return CallInfo(_COLLECTIVE, tensor, reduces, aliases, color, functional)


_SCATTER_SINGLE = ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single",
                   "reduce_scatter_single_coalesced")
_GATHER_SINGLE = ("_allgather_base", "allgather_into_tensor_coalesced", "all_gather_single",
                  "all_gather_single_coalesced")
# The functional collectives (torch.ops._c10d_functional.*) of each kind of work.
_F_BROADCAST = ("broadcast", "broadcast_")
_F_REDUCE = ("all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_")
_F_GATHER = ("all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced")
_F_SCATTER = ("reduce_scatter_tensor", "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced")
_F_ALL_TO_ALL = ("all_to_all_single",)

#: Every call the ranks' wrappers watch, in the order the board numbers them: the
#: point-to-point calls, then the collectives (the newer names are wrapped only where the
#: installed torch has them).
KNOWN: dict[str, CallInfo] = {
    "send": _p2p("#1f77b4"),
    "recv": _p2p("#ff7f0e"),
    "isend": _p2p("#6baed6", ("isend",)),
    "irecv": _p2p("#fdae6b", ("irecv",)),
    "batch_isend_irecv": _p2p(functional=("batch_p2p_ops",)),
    "send_object_list": _p2p(),
    "recv_object_list": _p2p(),
    "broadcast": _coll(None, "broadcast", color="#9467bd", functional=_F_BROADCAST),
    "all_reduce": _coll(None, "allreduce", "allreduce_coalesced", reduces=True, color="#2ca02c", functional=_F_REDUCE),
    "reduce": _coll(None, "reduce", reduces=True),
    "all_gather": _coll("tensor", "allgather", "allgather_coalesced", "_allgather_base", "all_gather_single",
                        functional=_F_GATHER),
    "all_gather_into_tensor": _coll("input_tensor", *_GATHER_SINGLE, functional=_F_GATHER),
    "gather": _coll("tensor", "gather", "gather_single", "gather_into_tensor"),
    "scatter": _coll("scatter_list", "scatter"),
    "reduce_scatter": _coll("input_list", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
                            reduces=True, functional=_F_SCATTER),
    "reduce_scatter_tensor": _coll("input", *_SCATTER_SINGLE, reduces=True, functional=_F_SCATTER),
    "all_to_all": _coll("input_tensor_list", "alltoall", "alltoall_base", "all_to_all_single", functional=_F_ALL_TO_ALL),
    "all_to_all_single": _coll("input", "alltoall_base", "all_to_all_single", functional=_F_ALL_TO_ALL),
    "barrier": _coll(None, "barrier", "monitored_barrier", color="#7f7f7f"),
    "monitored_barrier": _coll(),
    "broadcast_object_list": _coll(),
    "all_gather_object": _coll(),
    "gather_object": _coll(),
    "scatter_object_list": _coll(),
    "_all_gather_base": _coll("input_tensor", functional=_F_GATHER),
    "_reduce_scatter_base": _coll("input", functional=_F_SCATTER),
    "all_gather_single": _coll("input_tensor", *_GATHER_SINGLE, functional=_F_GATHER),  # successor of all_gather_into_tensor
    "reduce_scatter_single": _coll("input", *_SCATTER_SINGLE, reduces=True, functional=_F_SCATTER),  # ... of reduce_scatter_tensor
    "all_reduce_coalesced": _coll("tensors", "allreduce_coalesced", reduces=True, functional=_F_REDUCE[2:]),
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
#: Pass this name in ``forbid`` to switch off ``torch.distributed.optim.ZeroRedundancyOptimizer``.
ZERO = "ZeroRedundancyOptimizer"
#: Pass this name in ``forbid`` to switch off FSDP: FSDP2's ``fully_shard`` and FSDP1's
#: ``FullyShardedDataParallel``.
FSDP = "FSDP"
#: Pass this name in ``forbid`` to switch off DTensor: ``DeviceMesh`` (so ``init_device_mesh``),
#: ``distribute_tensor``, ``distribute_module``, ``DTensor.from_local`` and ``parallelize_module``.
DTENSOR = "DTensor"
#: Pass this name in ``forbid`` to switch off ``torch.distributed.pipelining``: its stages,
#: its schedules and ``pipeline``.
PIPELINING = "pipelining"
#: The names ``forbid`` takes that switch off a whole API rather than one call, with their
#: family (:attr:`helpers.ForbiddenCallError.family`); what each refuses is
#: :mod:`helpers._runtime.apis`.
APIS = {DDP: "ddp", COURSE_RING: "course_ring", ZERO: "zero", FSDP: "fsdp", DTENSOR: "dtensor",
        PIPELINING: "pipelining"}
#: The families a switched-off call can belong to (:attr:`helpers.ForbiddenCallError.family`).
FAMILIES = (_COLLECTIVE, _P2P, *APIS.values())
#: What DistributedDataParallel's constructor is noted as on the board while it runs: it
#: broadcasts rank 0's weights from C++, a collective every rank of the group must join.
DDP_CONSTRUCTOR = "DistributedDataParallel"
#: Every call a rank notes on the board (its index is what the board stores).
CALLS = POINT_TO_POINT + COLLECTIVES + ("wait", DDP_CONSTRUCTOR)

#: Process-group methods that do the same work as a public call; forbidding it forbids these too.
FORBIDDEN_ALIASES = {name: info.aliases for name, info in KNOWN.items() if info.aliases}
#: Functional collectives (keys of :data:`FUNCTIONAL_OPS`) that do the same work as a public
#: call; forbidding it forbids these too, however they are reached.
FORBIDDEN_FUNCTIONAL = {name: info.functional for name, info in KNOWN.items() if info.functional}

#: ``ProcessGroup`` methods a program (or torch's own Python code) may call directly, each
#: with the public call doing the same work (its trace event's ``op``) and the position of
#: the argument whose tensors say how many bytes move (None: none). ``send`` and ``recv`` are
#: requests, as ``isend`` and ``irecv`` are. Wrapped where the installed torch has them.
PROCESS_GROUP_METHODS: dict[str, tuple[str, int | None]] = {
    "allreduce": ("all_reduce", 0),
    "allreduce_coalesced": ("all_reduce_coalesced", 0),
    "broadcast": ("broadcast", 0),
    "reduce": ("reduce", 0),
    "allgather": ("all_gather", 1),
    "allgather_coalesced": ("all_gather_coalesced", 1),
    "_allgather_base": ("all_gather_into_tensor", 1),
    "allgather_into_tensor_coalesced": ("all_gather_into_tensor", 1),
    "all_gather_single": ("all_gather_single", 1),
    "all_gather_single_coalesced": ("all_gather_single", 1),
    "gather": ("gather", 1),
    "scatter": ("scatter", 1),
    "reduce_scatter": ("reduce_scatter", 1),
    "_reduce_scatter_base": ("reduce_scatter_tensor", 1),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter_tensor", 1),
    "reduce_scatter_single": ("reduce_scatter_single", 1),
    "reduce_scatter_single_coalesced": ("reduce_scatter_single", 1),
    "alltoall": ("all_to_all", 1),
    "alltoall_base": ("all_to_all_single", 1),
    "all_to_all_single": ("all_to_all_single", 1),
    "barrier": ("barrier", None),
    "monitored_barrier": ("monitored_barrier", None),
    "send": ("isend", 0),
    "recv": ("irecv", 0),
    "recv_anysource": ("irecv", 0),
}

#: The functional collectives (``torch.ops._c10d_functional.<name>``, and the three of
#: ``torch.ops._c10d_functional_autograd``), each with the public call doing the same work:
#: the ``op`` of its trace event. ``wait_tensor`` is not one: it is where their results are waited for.
FUNCTIONAL_OPS: dict[str, str] = {
    **dict.fromkeys(_F_BROADCAST, "broadcast"),
    **dict.fromkeys(_F_REDUCE[:2], "all_reduce"),
    **dict.fromkeys(_F_REDUCE[2:], "all_reduce_coalesced"),
    **dict.fromkeys(_F_GATHER, "all_gather_into_tensor"),
    **dict.fromkeys(_F_SCATTER, "reduce_scatter_tensor"),
    "all_to_all_single": "all_to_all_single",
    "isend": "isend",
    "irecv": "irecv",
    "batch_p2p_ops": "batch_isend_irecv",
}

#: The Python functions of ``torch.distributed._functional_collectives`` and the functional
#: collective each one makes: switched off with it, so that the error names the function the
#: program called (the op itself is switched off too, for every other way of reaching it).
FUNCTIONAL_ENTRY_POINTS: dict[str, str] = {
    "broadcast": "broadcast",
    **dict.fromkeys(("all_reduce", "all_reduce_inplace"), "all_reduce"),
    "all_reduce_coalesced": "all_reduce_coalesced",
    **dict.fromkeys(("all_gather_tensor", "all_gather_single", "all_gather_tensor_autograd",
                     "all_gather_single_autograd", "all_gather_tensor_inplace", "all_gather_inplace",
                     "all_gather_into_tensor_coalesced", "all_gather_single_coalesced"), "all_gather_into_tensor"),
    **dict.fromkeys(("reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter_tensor_autograd",
                     "reduce_scatter_single_autograd", "reduce_scatter_tensor_inplace",
                     "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced"), "reduce_scatter_tensor"),
    **dict.fromkeys(("all_to_all_single", "all_to_all_single_autograd", "all_to_all_inplace", "permute_tensor"),
                    "all_to_all_single"),
    "isend_inplace": "isend",
    "irecv_inplace": "irecv",
    "batch_p2p_ops_inplace": "batch_p2p_ops",
}


def family_of(name: str) -> str:
    """The family (one of :data:`FAMILIES`) of a name ``forbid`` accepts."""
    if name in APIS:
        return APIS[name]
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
