"""The lesson notebooks: do they run, and is the learner version what it should be?"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from _torch_features import TORCH
from autograder.site.execute import executed
from conftest import suite_run_id

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted(p.name for p in (ROOT / "solutions").iterdir() if (p / f"{p.name}.ipynb").is_file())


def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_are_lessons():
    """Is there at least one lesson, so the checks below check something?"""
    assert LESSONS, "solutions/ holds no lesson notebooks"


#: What cells must print when the notebook runs here: (a line that names the cell in its
#: source, a pattern its text output must match). Lesson 08 promises each mistake's real
#: message from a real run; these catch a message that changed with a torch release, or a
#: hang report that lost the learner's line.
EXPECTED_OUTPUTS = {
    "08-debugging-and-performance": [
        ("def swap_receive_first(", r"rank 0 waits in recv\(src=1\) at Cell In\[\d+\], line 3"),
        ("def swap_receive_first(", r"every rank is receiving before anyone sends"),
        ("def sizes_differ(", r"rank 0 made the call that pairs with rank 1's all_reduce and returned"),
        ("def mean_gradient(", r"without dividing: \[10\.0, 10\.0, 10\.0, 10\.0\]"),
        ("def my_share(", r"rank 3 of 4 raised IndexError"),
        ("def fixed_port(", r"(?i)EADDRINUSE|address already in use"),
        ("cuda_then_fork.py", r"Cannot re-initialize CUDA in forked subprocess"),
        ("def only_rank_zero_logs(", r"rank 1 never reached all_reduce: it already returned"),
        ("def train_twice(", r"trying to initialize the default process group twice"),
        ("def nccl_ranks_share_a_gpu(", r"Duplicate GPU detected"),
        ("def read_too_early(", r"read after wait\(\): +\[1\.0, 2\.0, 3\.0\]"),
        ("def sizes_differ_in_detail(", r"(?i)mismatch between collectives"),
        ("def one_rank_is_late(", r"rank 0: .*Rank 2 failed to pass monitoredBarrier"),
        ("def short_timeout(", r"Timed out waiting 2000ms"),
        ("def wrong_interface(", r"Unable to find address for: eth7"),
        ("try_program(Broken, name)", r"rank 0 waits in recv\(src=1\) at Cell In\[\d+\], line \d+, in pass_right"),
        ("def step_time(", r"bucket_cap_mb=0\.01 +24 all-reduces per step"),  # one per layer, not per parameter
        ("def compare_rings(", r"schedule of rank 0 of 3: \[\(0, 2, True\), \(2, 1, True\), \(1, 0, False\), \(0, 2, False\)\]"),
    ],
    # Lesson 06's prose reads these off its cells (torch 2.13): Join's divisor, the hooks' order under a forward pass
    # the data steers, where clipping belongs, SyncBatchNorm on a CPU, per-rank seeds, the first step's single bucket.
    "06-ddp": [
        # On a GPU machine too (the model must sit on DataParallel's first GPU), not only on a CPU one.
        ("dp = nn.DataParallel(model)", r"same output as calling the model itself: True"),
        ("def lone_last_step(", r"divide_by_initial_world_size=True: rank 0's gradient at its two steps: \[1\.0, 0\.5\]"),
        ("def lone_last_step(", r"divide_by_initial_world_size=False: rank 0's gradient at its two steps: \[1\.0, 1\.0\]"),
        ("def hook_order(", r"rank 0: hooks fired in the order \['b', 'a'\]\nrank 1: hooks fired in the order \['a', 'b'\]"),
        ("def clipped_step(", r"clipped before the sync: same step as one process: False"),
        ("def clipped_step(", r"clipped after  the sync: same step as one process: True"),
        ("def batch_statistics(", r"SyncBatchNorm here: ValueError: SyncBatchNorm expected input tensor to be on GPU|"
                                  r"SyncBatchNorm's mean"),
        ("def dropout_mask(", r"one seed for all : units dropped on rank 0 (\[[01, ]+\]), on rank 1 \1\n"),
        ("for cap in (25, 1):", r"bucket_cap_mb= 1, step 1: 1 all-reduce\(s\), MB: \[6\.0\d\]\n"
                                r"bucket_cap_mb= 1, step 2: 6 all-reduce\(s\)"),
    ],
    # Lesson 07: what the old launcher passes in torch 2.13 (the argument and the variable), and what torchrun passes.
    "07-launching-at-scale": [
        ('"-m", "torch.distributed.launch"', r"rank \d: arguments \['--local-rank=\d'\], LOCAL_RANK=\d"),
        ('"-m", "torch.distributed.launch"', r"rank \d: arguments \[\], LOCAL_RANK=\d, local rank \d \(from LOCAL_RANK\)"),
        # Sections 6-8: no checkpoint restarts at 0, a checkpoint every 3 steps resumes at 6, and on 2 processes too.
        ('timeline(lost_events', r"each attempt started at step: \[\(0, 0\), \(1, 0\)\]"),
        ('kept, kept_events = survive(', r"each attempt started at step: \[\(0, 0\), \(1, 6\)\]"),
        ("newest complete checkpoint:", r"newest complete checkpoint: ckpt/step-0012\n.*FileNotFoundError"),
        ('two, two_events = survive(', r"exit code: 0 \| processes: \[2\] \| started at step: \[6\]"),
        ('exercise("7.2").self_check(resilient_main)', r"Self-check passed: on 2 processes"),
    ],
    # Lesson 09's prose quotes these numbers (DTensor's own collectives in the trace); older torch says "Skipped".
    "09-sharding": [
        # Section 1: why the float32 slope lands on the formula; mixed precision's 20 bytes with 16-bit gradients
        # and 18 with Megatron-LM's float32 main_grad (its distributed-optimizer table).
        ("def held_after_forward(", r"(?m)^float32 +batch.*-> 6,912 bytes per sample|Skipped|not run while"),
        ("def mixed_precision_step(", r"bfloat16 gradients +198,528 bytes = 2 x N\n(.*\n){3}  total at the step +1,985,280 bytes "
                                      r"= 20 x N\n.*main_grad.*\n.*\n  bfloat16 gradients +0 bytes = 0 x N\n(.*\n){3}"
                                      r"  total at the step +1,786,752 bytes = 18 x N|Skipped|not run while"),
        # fully_shard cuts each rank's own copy: no collective at all.
        ("def shards(", r"calls to torch.distributed each rank made to shard the model: \[0, 0, 0, 0\]|Skipped"),
        # A transformer block: the formula 4bs(16h + 4 + as), the fused kernel's log-sum-exp instead of the scores.
        ("def block_held(", r"256 +4,202,496 +4,202,\d\d\d +2,113,536 +2,1\d\d,\d\d\d|Skipped|not run while"),
        # The DTensor primer: what each placement change costs.
        ("def dtensor_tour(", r"full_tensor\(\) +rank 1 made: all_gather\w* \(8 B, functional\)|Skipped"),
        ("def dtensor_tour(", r"Partial -> Replicate\(\) +rank 1 made: all_reduce \(32 B, functional\)|Skipped"),
        ("def dtensor_tour(", r"Partial -> Shard\(0\) +rank 1 made: reduce_scatter\w* \(32 B, functional\)|Skipped"),
        # reshard_after_forward as an int: the backward gathers within pairs, half of every block held.
        ("def fsdp_step(", r"reshard_after_forward=2 +: 6 all-gathers \(3 of them within a pair of ranks\).*198,528 = 4N/2|Skipped"),
        # The reduce_dtype trap: left unset, the reduce-scatter runs in bfloat16.
        ("bf16 params, reduce_dtype unset", r"reduce_dtype unset: +\[.*\('reduce_scatter\w*', 'bfloat16', 66176\)\]|Skipped"),
        # Prefetching, in the order the calls were issued.
        ("def issue_order(", r"default +AG F0 AG F1 AG F2 B2 AG AG RS B1 AG RS B0 RS|Skipped"),
        ("def issue_order(", r"forward prefetch +AG AG F0 AG F1 F2 B2 AG AG RS|Skipped"),
        # HSDP on a 2 x 2 mesh, and gradient accumulation without a sync each micro-batch.
        ("def hsdp_steps(", r"HSDP: blocks\[0\]\[0\]\.weight \(Replicate\(\), Shard\(dim=0\)\), local \(128, 64\); after 2 SGD "
                            r"steps, largest difference from one process: (\d\.\de-0[6-9]|\d\.\de-1\d|0\.0e\+00)|Skipped"),
        ("def hsdp_steps(", r"all_reduce over \[0, 2\] x6|Skipped"),
        ("def hsdp_steps(", r"reduced after each: 12 reduce-scatters.*\n.*reduced with the last only: 3 reduce-scatters|Skipped"),
        # FSDP2's chunks of a 5-row weight on 4 ranks, and the padded all-gather.
        ("def padded(", r"local shards of a 5 x 3 weight on 4 ranks: \[\(2, 3\), \(2, 3\), \(1, 3\), \(0, 3\)\]\n"
                        r".*\[32, 32, 32, 32\]|Skipped"),
        ("def clip_then_gather(", r"all_reduce +48 bytes of float32, via='functional'|Skipped"),
        ("def clip_then_gather(", r"all_gather_into_tensor +16,384 bytes of float32, via='functional'|Skipped"),
        # The GPU route: one rank per GPU over nccl where there are GPUs, the same training as one process.
        ("def fsdp_on_gpus(", r"Skipped: this machine has no GPU|rank 0: nccl on cuda:0, blocks\[0\]\[0\]\.weight's shard "
                              r"\(\d+, 64\); after 3 AdamW steps, largest difference from one process: (\d\.\de-0[5-9]|0\.0e\+00)"),
    ],
    # Lesson 10's prose quotes these numbers; a section that needs a newer torch says "Skipped".
    "10-model-parallelism": [
        ("def tp_forward(", r"each rank's output equals the whole MLP's: \[True, True, True, True\]"),
        # torch.autograd.Function, taught before Exercise 10.1 needs it.
        ("class Cube(", r"x\.grad = \[3\.0, 12\.0, 27\.0\]; autograd's own x \*\* 3 gives \[3\.0, 12\.0, 27\.0\]"),
        ("class Cube(", r"x\.grad = \[2\.0, 2\.0, 2\.0\].*\n.*CubeBackward.*\ngradcheck\(Cube\.apply\): True"),
        ("def dtensor_mlp(", r"collectives +\{'c10d_functional\.all_reduce': 2\}|Skipped"),
        ("def dtensor_mlp(", r"your TensorParallelMLP: +\[\(128, 'torch\.distributed'\), \(128, 'torch\.distributed'\)\]|Skipped"),
        ("def dtensor_mlp(", r"parallelize_module: +\[\(128, 'functional'\), \(128, 'functional'\)\]|Skipped"),
        ("def dtensor_mlp(", r"same output +True\nsame x\.grad +True|Skipped"),
        ("def dtensor_mlp(", r"set-up, rank 0: \[\('scatter', \d+\), \('scatter', \d+\), \('scatter', \d+\), \('broadcast', \d+\)\]|Skipped"),
        ("def dtensor_mlp_on_gpus(", r"Skipped: this machine has no GPU|over nccl:\n  local shapes .*\n  same output +True\n"
                                     r"  same x\.grad +True"),
        ("def sequence_parallel(", r"same result as all-reduce then layer norm: \[True, True, True, True\]"),
        ("def one_batch_step(", r"bubble: 3/4 of the ranks' time idle"),
        ("stages, counts = 4", r"m = 8: the step takes 33 units, bubble 3/11 \(the formula \(p-1\)/\(m\+p-1\) gives 3/11\)"),
        ("for name, schedule in", r"1F1B: most micro-batches' activations held per stage \[4, 3, 2, 1\], bubble 3/11"),
        ("def torch_pipeline(", r"GPipe: each stage's gradient / one process's: \[1\.0, 1\.0, 1\.0, 1\.0\]|Skipped"),
        ("loss_fn = mean, scale_grads=True (the default)", r"mean / m, scale_grads=True +gradient / one process's = 0\.2500|Skipped"),
        ("def moe_layer(", r"every token came back through its expert: \[True, True, True, True\]"),
        ("def moe_layer(", r"the router's gradient norm on each rank \(through the gates\): \[0\.0*[1-9]"),
        # Section 8: parallelize_module then fully_shard on a 2 x 2 mesh, against one process.
        ("def two_d_torch(", r"rank 3: fc1\.weight .*local \(4, 8\) of \(16, 8\); after 3 SGD steps, largest difference from "
                             r"one process: (\d\.\de-0[6-9]|0\.0e\+00)|Skipped"),
        ("nodes, gpus_per_node, shape", r"its data-parallel peer: 8 \(node 1\) \| its pipeline peer: 16 \(node 2\)"),
        # Past 1F1B: two chunks per rank, and ZB-H1's split backward, on the clock; torch's own chunked schedules.
        ("def zero_bubble_step(", r"interleaved, 2 chunks +57 units, bubble 3/19 +\(formula 3/19\)"),
        ("def zero_bubble_step(", r"ZB-H1 +27 units, bubble 1/9 +\(formula 1/9\); most activations held on a rank: 4"),
        ("def torch_chunked(", r"ScheduleInterleavedZeroBubble: each chunk's gradient / one process's, rank by rank: "
                               r"\[\[1\.0, 1\.0\], \[1\.0, 1\.0\]\]|Skipped"),
        # Activation memory from torch's own orders (p = 4, m = 8, v = 2): depth-first interleaving holds 5.5 stages'
        # worth on rank 0 against 1F1B's 4; ZB-V, placed in a V, holds 1F1B's 4 on every rank.
        ("def torch_orders(", r"ScheduleInterleaved1F1B: pieces per rank \[\[0, 4\], \[1, 5\], \[2, 6\], \[3, 7\]\]; most chunk-"
                              r"micro-batches held per rank \[11, 9, 7, 5\] = \[5\.5, 4\.5, 3\.5, 2\.5\]|Skipped"),
        ("def torch_orders(", r"ScheduleZBVZeroBubble: pieces per rank \[\[0, 7\], \[1, 6\], \[2, 5\], \[3, 4\]\]; most chunk-"
                              r"micro-batches held per rank \[8, 8, 8, 8\] = \[4\.0, 4\.0, 4\.0, 4\.0\]|Skipped"),
        ("def rpc_split_model(", r"rank 0's loss over 5 steps: \[[\d., ]+\]"),
    ],
    # Lesson 11's prose reads these off its cells: the memory formulas, the exact merge, the ring's messages, the
    # causal work per rank in order and in zig-zag, the bytes of the ring and of Ulysses, torch's context_parallel.
    "11-long-sequences": [
        ("def saved_bytes(", r"2048 +70,254,592 70,254,592 +4,227,072 +4,227,072"),
        ("def block_attention(", r"8 block\(s\) of keys: largest difference from whole attention \d\.\de-1[4-7]"),
        ("def block_attention(", r"without rescaling the old terms: largest difference [1-9]"),
        ("def wait_then_compute(", r"rank 1's calls: \[(\('isend', 2, 524288\), \('irecv', 0, 524288\)(, )?){3}\]"),
        ("def wait_then_compute(", r"wait, then compute +: output blocks \(4, 512, 32\); share of transfer time hidden"),
        # The ring's backward: under autograd it keeps every block and loses dk/dv; written out it keeps two blocks.
        ("def ring_backward(", r"under autograd: keeps 6,369,280 bytes for backward \(24\.3 key/value blocks' worth\); sends 3 blocks "
                               r"in forward, 0 in backward; largest difference from one process: dq \de-1\d, dk [1-9]e-01"),
        ("def ring_backward(", r"RingAttention\.apply: keeps 528,384 bytes for backward \(2\.0 key/value blocks' worth\); sends 3 "
                               r"blocks in forward, 7 in backward; largest difference from one process: dq \de-1\d, dk \de-1\d, "
                               r"dv \de-1\d"),
        ("def count_scores(", r"scores per rank \[262144, 524288, 786432, 1048576\] = \[1, 2, 3, 4\] blocks"),
        ("def zigzag_counts(", r"scores per rank \[655360, 655360, 655360, 655360\] = \[2\.5, 2\.5, 2\.5, 2\.5\]"),
        ("def traffic(", r"ring +bytes sent per rank on \(2, 3, 4\) ranks: \[36864, 49152, 55296\] \(formula \[36864, 49152, 55296\]\)"),
        ("def traffic(", r"Ulysses +bytes sent per rank on \(2, 3, 4\) ranks: \[36864, 32768, 27648\] \(formula \[36864, 32768, 27648\]\)"),
        # torch's context_parallel on CPU ranks: causal attention refused at once; the slow non-causal call (tests/
        # test_context_parallel.py runs it) left to the learner, with what the lesson's table says of this torch.
        ("def torch_context_parallel(", r"  causal +forward +: NotImplementedError: .*sharding strategy|Skipped"),
        ("def torch_context_parallel(", r"non-causal forward +: not run \(set RUN_SLOW_CASE = True to run it\); by the table, this "
                                        + ("torch runs it, all-gathering K and V" if TORCH >= (2, 12) else "torch refuses it")
                                        + r"|Skipped"),
        ("def context_parallel_on_gpus(", r"Skipped: this machine has no GPU|rank 0 on cuda:0 over nccl, causal forward: runs in \d+ s: "
                                          r"local shape \(1, 4, 64, 32\), largest difference from one process (\d\.\de-0[3-9]|\d\.\de-1\d|"
                                          r"0\.0e\+00)"),
        ("def partners(", r"torchtitan's order.*\n  pp: rank 0's group \[0, 16\], on node\(s\) \[0, 2\]\n  dp: rank 0's group \[0, 8\], "
                          r"on node\(s\) \[0, 1\]\n  cp: rank 0's group \[0, 4\], on node\(s\) \[0\]\n  tp: rank 0's group \[0, 1, 2, 3\]"),
        ("def partners(", r"Llama 3's and picotron's order.*\n  dp: rank 0's group \[0, 16\], on node\(s\) \[0, 2\]\n  pp: rank 0's "
                          r"group \[0, 8\], on node\(s\) \[0, 1\]"),
        ("def partners(", r"cp: rank 0's group \[0, 8, \.\.\., 120\] \(16 ranks\), on node\(s\) 0 to 15 \(16 nodes\)\n"
                          r"  tp: rank 0's group \[0, 1, 2, 3, 4, 5, 6, 7\], on node\(s\) \[0\]"),
        ("def where_am_i(", r"rank 2 on host 1: tp group \[2, 3\], cp group \[0, 2\]"),
    ],
    # Lesson 12's prose reads these off its cells: the plan equal to every measurement, the layer's kept tensors, 1F1B's
    # in-flight activations falling stage by stage, the two proofs, the GPU route, the published runs.
    "12-planning-a-run": [
        ("def planned_beside_measured(", r"10 layouts: largest difference between plan and measurement: parameters "
                                         r"0\.00%, gradients 0\.00%, optimizer 0\.00%, activations 0\.00%"),
        ("def kept_by_one_layer(", r"recompute='selective': 15 tensors, 297,472 bytes"),
        ("def activations(runs)", r"1f1b, fp32 +1,191,936 +892,416 +594,944 +363,776"),
        ("TOLERANCE = 1e-4", r"(?s)ZeRO-1.*equal to one process within 0\.0001.*ZeRO-2.*equal to one process within 0\.0001"),
        # torch's own route (DTensor tp, FSDP2 over dp): equal to one process from torch 2.9, a stated skip before it.
        ("measure_torch(SMALL", r"(?s)FSDP2 \(fully_shard\) dp 2.*equal to one process within 0\.0001.*reduce_scatter over dp"
                                if TORCH >= (2, 9) else r"Skipped: torch .* is older than 2\.9"),
        ("GPU_MODEL = Model(", r"Skipped: this machine has no GPU|predicted [\d.]+ ms \([\d.]+x\); peak memory"),
        ("def against_published(", r"405B dp 64 x tp 8 x pp 16 x cp 1, ZeRO-1, 32 micro-batches of 1, full +24\.\d +"),
        ("def against_published(", r"8B dp 8 x tp 1 x pp 1 x cp 1, ZeRO-3, 1 micro-batch of 2, selective +109\.9!"),
        ("from helpers.timeline import replay", r"trace: lesson12-1x1x2x2\.trace\.json"),
    ],
}


def _text_outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
    return "".join(parts)


@pytest.mark.slow
@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_notebook_runs_top_to_bottom(lesson, tmp_path):
    """Does the instructor notebook, solutions included, run without an error on this machine?

    It runs through :func:`autograder.site.execute.executed` (nbclient, 180 s a cell, in the lesson's
    folder), which keeps the executed notebook for `make site`; `tests/test_site.py` builds the
    site from it instead of running the notebooks a second time."""
    # Run once per test run, under the lesson's lock, and kept in the cache that `make site` builds from.
    nb, run = executed(lesson, ROOT, reuse="this-run", run_id=suite_run_id())
    print(f"{lesson}: ran in {run.seconds:.1f} s" + ("" if run.ran else " (by another test of this run)"))
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            assert output.get("name") != "stderr" or not output.get("text", "").strip() or "Warning" in output.get("text", ""), (
                f"{lesson}: a cell wrote to stderr: {output.get('text', '')[:300]}"
            )
    for marker, pattern in EXPECTED_OUTPUTS.get(lesson, []):
        cells = [c for c in nb.cells if c.cell_type == "code" and marker in _source(c)]
        assert len(cells) == 1, f"{lesson}: {len(cells)} code cells contain {marker!r}"
        text = _text_outputs(cells[0])
        assert re.search(pattern, text), f"{lesson}: the cell with {marker!r} printed no match for {pattern!r}:\n{text[:2000]}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_learner_notebook_has_no_solutions_or_hidden_tests(lesson):
    """Does course/ hold the learner version: no solution, no hidden test, stubs that name the exercise?"""
    path = ROOT / "course" / lesson / f"{lesson}.ipynb"
    assert path.is_file(), f"{path} is missing: run `make course`"
    nb = json.loads(path.read_text())
    text = "\n".join(_source(c) for c in nb["cells"])
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert marker not in text, f"{lesson}: the learner notebook still contains {marker!r}"
    solution_cells = [c for c in nb["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    for cell in solution_cells:
        if cell["cell_type"] == "code":
            src = _source(cell)
            assert re.search(r'raise NotImplementedError\("Exercise [\w.]+: ', src), (
                f"{lesson}: an exercise stub does not name its exercise:\n{src}"
            )


def test_course_is_in_sync_with_solutions():
    """Is every course/ notebook exactly what `make course` builds from solutions/ now?"""
    from autograder.notebooks.generate import stale_lessons

    assert stale_lessons() == [], "course/ is out of date: run `make course` and commit course/"


def test_every_learner_notebook_is_one_jupyterlab_opens_as_it_is():
    """Is every course/ notebook one that JupyterLab opens without rewriting it (valid nbformat 4.5 or later, every
    cell with its id) and runs with a kernel this Python has (python3)? The browser opens only some of them
    (tests/test_browser.py's in_the_browser); this holds for all."""
    from jupyter_client.kernelspec import KernelSpecManager

    have = set(KernelSpecManager().find_kernel_specs())
    problems = []
    for lesson in LESSONS:
        path = ROOT / "course" / lesson / f"{lesson}.ipynb"
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as err:
            problems.append(f"{lesson}: not a valid notebook: {err.message}")
        if (nb.nbformat, nb.nbformat_minor) < (4, 5) or any("id" not in cell for cell in nb.cells):
            problems.append(f"{lesson}: nbformat {nb.nbformat}.{nb.nbformat_minor} or cells without ids (JupyterLab "
                            "would add them and save)")
        spec = nb.metadata.get("kernelspec", {})
        if spec.get("name") != "python3" or spec.get("language") != "python" or "python3" not in have:
            problems.append(f"{lesson}: kernelspec {spec}; this Python has {sorted(have)}")
    assert not problems, "\n".join(problems)


def test_lesson_00_lists_every_lesson_on_the_road_ahead():
    """Does lesson 00's road-ahead table give one row to every lesson in solutions/, from 00 to the last, in order?"""
    nb = json.loads((ROOT / "solutions" / "00-getting-started" / "00-getting-started.ipynb").read_text())
    text = next(_source(c) for c in nb["cells"] if "## The road ahead" in _source(c))
    table = text.split("## The road ahead", 1)[1]
    rows = re.findall(r"^\| (\d{2}) ", table, re.M)
    assert rows == [lesson[:2] for lesson in LESSONS], f"the road ahead lists lessons {rows}; solutions/ has {LESSONS}"


@pytest.mark.slow
def test_a_failing_self_check_reads_as_exercise_part_and_message_in_a_kernel(tmp_path):
    """In a real kernel, does a failing self-check show 'GradingFailure: Exercise 5.1, part "self-check": ...' with the
    fix, and none of the checks' frames (exercise.py, lesson05.py), while a fault of the course (CheckError) keeps its
    traceback for the instructor?"""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in (
        "import torch, torch.distributed as dist\nfrom autograder import exercise",
        "def average_gradients(model):\n    for p in model.parameters():\n        if p.grad is not None:\n"
        "            dist.all_reduce(p.grad)          # the sum, never divided",
        'exercise("5.1").self_check(average_gradients)',
        "from autograder.kit.exercise import Exercise, Part\n"
        "broken = Exercise(number=\"9.9\", function=\"f\", title=\"t\", parts=(Part(\"p\", 1, \"p.\"),))\n"
        "broken.grade(print, \"p\", lambda a: {}[\"key\"])",
    )])
    NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    [failure] = [o for o in nb.cells[2].outputs if o.output_type == "error"]
    shown = "\n".join(failure.traceback)
    assert failure.ename == "GradingFailure"
    assert re.search(r'GradingFailure.*: Exercise 5\.1, part "self-check": on 2 ranks.*Did you divide by the world size\?', shown), shown
    assert not [name for name in ("exercise.py", "lesson05.py", "gradcheck.py", "harness.py", "Traceback") if name in shown], shown
    [fault] = [o for o in nb.cells[3].outputs if o.output_type == "error"]
    assert fault.ename == "CheckError" and "the course's check itself failed (KeyError" in fault.evalue
    assert "exercise.py" in "\n".join(fault.traceback)  # the whole traceback, for the instructor


def test_notebook_runs_leave_the_hidden_tests_out_unless_asked(monkeypatch):
    """Do the notebook runs (tests, site) run a graded cell as the learner's notebook does, without its hidden tests,
    keep the full source for the stored notebook, and run them with COURSE_NOTEBOOK_HIDDEN_TESTS=run (test-compat)?"""
    from autograder.site import execute

    path = ROOT / "solutions" / "04-ring-all-reduce" / "04-ring-all-reduce.ipynb"
    nb = nbformat.read(path, as_version=4)
    before = [cell.source for cell in nb.cells]
    full = execute._clear_hidden_tests(nb)
    assert len(full) == 10, sorted(full)  # lesson 04's ten graded parts
    for index, source in full.items():
        assert "BEGIN HIDDEN TESTS" in source and source == before[index]
        assert "HIDDEN TESTS" not in nb.cells[index].source and "grade(" not in nb.cells[index].source
    assert all(cell.source == before[i] for i, cell in enumerate(nb.cells) if i not in full)
    monkeypatch.delenv(execute.HIDDEN_ENV, raising=False)
    without = execute.cache_key("04-ring-all-reduce", ROOT)
    monkeypatch.setenv(execute.HIDDEN_ENV, "run")
    assert execute._run_hidden() and execute.cache_key("04-ring-all-reduce", ROOT) != without
