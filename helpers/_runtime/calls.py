"""The torch.distributed calls the helpers know, by name.

:data:`POINT_TO_POINT`, :data:`COLLECTIVES` and :data:`DATA_COLLECTIVES` (every collective
that moves data, the set an exercise switches off when it asks for a hand-made one), the
names ``forbid`` accepts besides them (:data:`DDP`, :data:`COURSE_RING`), and :data:`CALLS`:
every call a rank notes on the board (:mod:`helpers._runtime.board`), in the order it stores them.

    >>> "all_reduce" in DATA_COLLECTIVES, "barrier" in DATA_COLLECTIVES
    (True, False)
"""

from __future__ import annotations

__all__ = ["POINT_TO_POINT", "COLLECTIVES", "DATA_COLLECTIVES", "DDP", "COURSE_RING", "DDP_CONSTRUCTOR", "CALLS",
           "FORBIDDEN_ALIASES", "NOT_COMMUNICATION"]

POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list")
COLLECTIVES = (
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "_all_gather_base",
    "_reduce_scatter_base",
    # Newer names; each is wrapped only where the installed torch has it.
    "all_gather_single",  # the successor of all_gather_into_tensor
    "reduce_scatter_single",  # the successor of reduce_scatter_tensor
    "all_reduce_coalesced",
    "all_gather_coalesced",
    "gather_single",  # torch 2.14: gather into one tensor on dst
    "gather_into_tensor",  # torch 2.14's deprecated name for gather_single
)
#: Every collective that moves data (all but the barriers): what an exercise that builds
#: its own collective switches off. The object collectives are in it: they call the others.
DATA_COLLECTIVES = tuple(c for c in COLLECTIVES if c not in ("barrier", "monitored_barrier"))
#: Pass this name in ``forbid`` to switch off ``torch.nn.parallel.DistributedDataParallel``.
DDP = "DistributedDataParallel"
#: Pass this name in ``forbid`` to switch off the course's own ring all-reduce (``helpers.ring``,
#: which lesson 8 teaches): an exercise that asks for a ring must not be answered by calling it.
COURSE_RING = "helpers.ring"
#: Every call a rank notes on the board (its index is what the board stores).
#: What DistributedDataParallel's constructor is noted as on the board while it runs: it
#: broadcasts rank 0's weights from C++, a collective every rank of the group must join.
DDP_CONSTRUCTOR = "DistributedDataParallel"
CALLS = POINT_TO_POINT + COLLECTIVES + ("wait", DDP_CONSTRUCTOR)

#: Process-group methods and functional collectives that do the same work as a public
#: collective; forbidding the collective forbids these too.
FORBIDDEN_ALIASES = {
    "all_reduce": ("allreduce", "allreduce_coalesced"),
    "broadcast": ("broadcast",),
    "reduce": ("reduce",),
    "all_gather": ("allgather", "allgather_coalesced", "_allgather_base", "all_gather_single"),
    "all_gather_into_tensor": ("_allgather_base", "allgather_into_tensor_coalesced", "all_gather_single"),
    "gather": ("gather", "gather_single", "gather_into_tensor"),
    "scatter": ("scatter",),
    "reduce_scatter": ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single"),
    "reduce_scatter_tensor": ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single"),
    "all_to_all": ("alltoall", "alltoall_base", "all_to_all_single"),
    "all_to_all_single": ("alltoall_base", "all_to_all_single"),
    "barrier": ("barrier", "monitored_barrier"),
    "all_gather_single": ("_allgather_base", "allgather_into_tensor_coalesced", "all_gather_single"),
    "reduce_scatter_single": ("_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single"),
    "all_reduce_coalesced": ("allreduce_coalesced",),
    "all_gather_coalesced": ("allgather_coalesced",),
    "gather_single": ("gather_single", "gather_into_tensor"),
    "gather_into_tensor": ("gather_single", "gather_into_tensor"),
}

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
