"""Every op of the nodal torch backend against gloo and against a reference computed here.

Run under nodalrun (tests/integration/torch_backend_test.cpp):
    nodalrun -n N python3 ops.py
Each rank makes the same inputs for every rank (seeded by case and rank), so it can compute each
result itself in rank order: nodal's results must equal that reference bit for bit (nodal combines
in rank order; f16/bf16 accumulate in f32 and round once). Where gloo has the op and dtype, nodal's
result must also equal gloo's: bit for bit for integers and for 2 ranks, to float tolerance for 3
and more ranks (gloo's ring adds in another order). Then the refusals and a mismatched call.
Prints "ops ok: N checks" on success; any failed check raises, which fails the job.
"""
import os
import warnings
import zlib

# The large allreduces below go through the progress thread (off by default; the rest of this
# suite covers the caller-thread path).
os.environ.setdefault("NODAL_TORCH_ASYNC", "1")

import torch
import torch.distributed as dist

import nodal_torch

warnings.filterwarnings("ignore", message=".*all_reduce_coalesced.*")
dist.init_process_group("nodal")
RANK, N = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "nodal", dist.get_backend()
GLOO = dist.new_group(backend="gloo")
checks = 0

R = dist.ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]
DTYPES = FLOATS + INTS + [torch.bool]
GLOO_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int32, torch.int64, torch.uint8, torch.int8}
SIZES = [1, 7, 1000, 70001]
OPS = {"sum": R.SUM, "product": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG}


def check(ok, what):
    global checks
    if not ok:
        raise AssertionError(f"rank {RANK}: {what}")
    checks += 1


def make(case, rank, shape, dtype, op=None):
    """Rank `rank`'s input for `case`: the same on every rank that asks."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64)
        if op is not None and op == R.PRODUCT:
            x = 1 + x / 8
        return x.to(dtype)
    low = 0 if dtype == torch.uint8 else -5
    return torch.randint(low, 6, shape, generator=g, dtype=torch.int64).to(dtype)


def reference(xs, op, dtype):
    """op over xs in rank order, as nodal defines it."""
    if dtype == torch.bool:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = acc | x if op in (R.SUM, R.MAX) else acc & x
        return acc
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if op == R.AVG and not dtype.is_floating_point:
        wide = torch.int64
    acc = xs[0].to(wide)
    for x in xs[1:]:
        x = x.to(wide)
        if op in (R.SUM, R.AVG):
            acc = acc + x
        elif op == R.PRODUCT:
            acc = acc * x
        elif op == R.MIN:
            acc = torch.minimum(acc, x)
        else:
            acc = torch.maximum(acc, x)
    if op == R.AVG:
        acc = acc / N if dtype.is_floating_point else torch.div(acc, N, rounding_mode="trunc")
    return acc.to(dtype)


def same(a, b, dtype, exact):
    if exact or not dtype.is_floating_point:
        return torch.equal(a, b)
    tol = 2e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


EXACT_VS_GLOO = N == 2

# ---- allreduce: every op and dtype, small to pipelined sizes, contiguous or not ----
for dtype in DTYPES:
    for op_name, op in OPS.items():
        if op == R.AVG and dtype == torch.bool:
            continue
        for size in SIZES:
            case = f"allreduce/{dtype}/{op_name}/{size}"
            xs = [make(case, j, [size], dtype, op) for j in range(N)]
            t = xs[RANK].clone()
            dist.all_reduce(t, op=op)
            ref = reference(xs, op, dtype)
            exact = not (op == R.AVG and dtype.is_floating_point)
            check(same(t, ref, dtype, exact), f"{case}: nodal differs from the rank-order reference: {t[:4]} vs {ref[:4]}")
            if dtype in GLOO_DTYPES and op != R.AVG:
                g = xs[RANK].clone()
                dist.all_reduce(g, op=op, group=GLOO)
                check(same(t, g, dtype, EXACT_VS_GLOO), f"{case}: nodal differs from gloo")

# A transposed (non-contiguous) tensor and a tensor in nodal's arena.
base = make("transposed", RANK, [33, 17], torch.float32)
t = base.t()
check(not t.is_contiguous(), "transposed view is contiguous")
dist.all_reduce(t)
ref = reference([make("transposed", j, [33, 17], torch.float32).t() for j in range(N)], R.SUM, torch.float32)
check(torch.equal(t, ref) and torch.equal(base, ref.t()), "allreduce of a transposed tensor")
s = nodal_torch.empty_shared([4096], torch.float32)
s.copy_(make("shared", RANK, [4096], torch.float32))
dist.all_reduce(s)
check(torch.equal(s, reference([make("shared", j, [4096], torch.float32) for j in range(N)], R.SUM, torch.float32)),
      "allreduce of an arena tensor")

# ---- allreduce from 1 MiB with NODAL_TORCH_ASYNC=1: on the progress thread (a pending Work whose
# future completes there) ----
threads_before = len(os.listdir("/proc/self/task"))
for dtype in [torch.float32, torch.bfloat16, torch.int64]:
    size = (1 << 20) // torch.empty(0, dtype=dtype).element_size() + 3
    case = f"async/{dtype}"
    xs = [make(case, j, [size], dtype) for j in range(N)]
    t = xs[RANK].clone()
    work = dist.all_reduce(t, async_op=True)
    # A blocking call made meanwhile runs after it, in call order.
    b = torch.full([5], float(RANK))
    dist.broadcast(b, src=N - 1)
    check(torch.equal(b, torch.full([5], float(N - 1))), f"{case}: broadcast behind a pending allreduce")
    future = work.get_future()
    work.wait()
    check(work.is_completed(), f"{case}: work completed")
    check(future.done() and torch.equal(future.value()[0], t), f"{case}: the future holds t")
    check(torch.equal(t, reference(xs, R.SUM, dtype)), f"{case}: result")
# The first such allreduce started the communicator's progress thread.
check(len(os.listdir("/proc/self/task")) > threads_before, "no progress thread: the allreduces ran on the caller's")
# A mismatched pending allreduce: the error comes from wait(), on every rank, and the group goes on.
if N > 1:
    work = dist.all_reduce(torch.ones((1 << 18) + RANK), async_op=True)
    try:
        work.wait()
        check(False, "a mismatched pending allreduce did not raise")
    except RuntimeError as e:
        check("nodal: allreduce: UsageError" in str(e), f"pending mismatch: {e}")
    t = torch.ones(1 << 19)
    dist.all_reduce(t)
    check(torch.equal(t, torch.full([1 << 19], float(N))), "pending allreduce after a mismatch")

# ---- allreduce_coalesced ----
shapes = [[3], [5, 2], [1000]]
xs = [[make(f"coalesced/{i}", j, sh, torch.float32) for i, sh in enumerate(shapes)] for j in range(N)]
ts = [x.clone() for x in xs[RANK]]
dist.all_reduce_coalesced(ts)
for i in range(len(shapes)):
    check(torch.equal(ts[i], reference([xs[j][i] for j in range(N)], R.SUM, torch.float32)), f"coalesced tensor {i}")

# ---- broadcast and reduce, every root ----
for dtype in DTYPES + [torch.int16, torch.complex64]:
    for root in range(N):
        for size in [1, 1000, 70001]:
            case = f"broadcast/{dtype}/{root}/{size}"
            src = make(case, root, [size], torch.float64 if dtype == torch.complex64 else dtype)
            if dtype == torch.complex64:
                src = torch.complex(src.float(), -src.float())
            elif dtype == torch.int16:
                src = src.to(torch.int16)
            t = src.clone() if RANK == root else torch.zeros_like(src)
            dist.broadcast(t, src=root)
            check(torch.equal(t, src), f"{case}")
for dtype in [torch.float32, torch.int64, torch.bfloat16]:
    for root in range(N):
        for op_name in ["sum", "max"]:
            op = OPS[op_name]
            case = f"reduce/{dtype}/{root}/{op_name}"
            xs = [make(case, j, [1000], dtype) for j in range(N)]
            t = xs[RANK].clone()
            dist.reduce(t, dst=root, op=op)
            if RANK == root:
                check(torch.equal(t, reference(xs, op, dtype)), case)
                if dtype in GLOO_DTYPES:
                    g = xs[RANK].clone()
                    dist.reduce(g, dst=root, op=op, group=GLOO)
                    check(same(t, g, dtype, EXACT_VS_GLOO), f"{case} vs gloo")
            elif dtype in GLOO_DTYPES:
                dist.reduce(xs[RANK].clone(), dst=root, op=op, group=GLOO)

# ---- allgather, _allgather_base, gather, scatter ----
for dtype in [torch.float32, torch.int64, torch.bool, torch.float16]:
    for size in [1, 1000, 70001]:
        case = f"allgather/{dtype}/{size}"
        xs = [make(case, j, [size], dtype) for j in range(N)]
        out = [torch.empty_like(xs[0]) for _ in range(N)]
        dist.all_gather(out, xs[RANK])
        check(all(torch.equal(out[j], xs[j]) for j in range(N)), case)
        flat = torch.empty(N * size, dtype=dtype)
        dist.all_gather_into_tensor(flat, xs[RANK])
        check(torch.equal(flat, torch.cat(xs)), f"_allgather_base {case}")
        if dtype in GLOO_DTYPES:
            gl = [torch.empty_like(xs[0]) for _ in range(N)]
            dist.all_gather(gl, xs[RANK], group=GLOO)
            check(all(torch.equal(out[j], gl[j]) for j in range(N)), f"{case} vs gloo")
        for root in range(N):
            got = [torch.empty_like(xs[0]) for _ in range(N)] if RANK == root else None
            dist.gather(xs[RANK], gather_list=got, dst=root)
            if RANK == root:
                check(all(torch.equal(got[j], xs[j]) for j in range(N)), f"gather {case} root {root}")
            parts = [make(f"scatter/{case}/{root}", j, [size], dtype) for j in range(N)]
            mine = torch.empty_like(parts[0])
            dist.scatter(mine, scatter_list=parts if RANK == root else None, src=root)
            check(torch.equal(mine, parts[RANK]), f"scatter {case} root {root}")

# ---- reduce_scatter (equal and unequal blocks) and _reduce_scatter_base ----
for dtype in [torch.float32, torch.int32, torch.bfloat16]:
    for counts in [[5] * N, [1000 + 37 * j for j in range(N)], [70001] * N]:
        case = f"reduce_scatter/{dtype}/{counts[0]}/{counts[-1]}"
        inputs = [[make(f"{case}/{q}", j, [counts[q]], dtype) for q in range(N)] for j in range(N)]
        out = torch.empty(counts[RANK], dtype=dtype)
        dist.reduce_scatter(out, [x.clone() for x in inputs[RANK]])
        check(torch.equal(out, reference([inputs[j][RANK] for j in range(N)], R.SUM, dtype)), case)
        if len(set(counts)) == 1:
            flat = torch.cat(inputs[RANK])
            out2 = torch.empty(counts[0], dtype=dtype)
            dist.reduce_scatter_tensor(out2, flat)
            check(torch.equal(out2, out), f"_reduce_scatter_base {case}")
            if dtype in GLOO_DTYPES:  # gloo has no reduce_scatter: its allreduce, then this rank's block
                g = flat.clone()
                dist.all_reduce(g, group=GLOO)
                check(same(out, g[RANK * counts[0]:(RANK + 1) * counts[0]], dtype, EXACT_VS_GLOO), f"{case} vs gloo")

# ---- all_to_all_single (equal and split sizes, 2-d rows) and all_to_all ----
for dtype in [torch.float32, torch.int64, torch.int16]:
    rows, cols = 3 * N, 5
    case = f"alltoall/{dtype}"
    xs = [make(case, j, [rows, cols], torch.int64).to(dtype) for j in range(N)]
    out = torch.empty(rows, cols, dtype=dtype)
    dist.all_to_all_single(out, xs[RANK])
    expect = torch.cat([xs[j][RANK * 3:(RANK + 1) * 3] for j in range(N)])
    check(torch.equal(out, expect), case)
    if dtype != torch.int16:
        g = torch.empty_like(out)
        dist.all_to_all_single(g, xs[RANK], group=GLOO)
        check(torch.equal(out, g), f"{case} vs gloo")
    # Rank j sends (q + j + 1) rows to rank q.
    send = [[q + j + 1 for q in range(N)] for j in range(N)]
    ys = [make(f"{case}/v", j, [sum(send[j]), cols], torch.int64).to(dtype) for j in range(N)]
    recv = [send[j][RANK] for j in range(N)]
    out = torch.empty(sum(recv), cols, dtype=dtype)
    dist.all_to_all_single(out, ys[RANK], output_split_sizes=recv, input_split_sizes=send[RANK])
    pieces = []
    for j in range(N):
        start = sum(send[j][:RANK])
        pieces.append(ys[j][start:start + send[j][RANK]])
    check(torch.equal(out, torch.cat(pieces)), f"{case} with split sizes")
    # all_to_all on lists, any size per pair.
    ins = [make(f"{case}/list/{q}", RANK, [RANK + q + 1], torch.int64).to(dtype) for q in range(N)]
    outs = [torch.empty(j + RANK + 1, dtype=dtype) for j in range(N)]
    dist.all_to_all(outs, ins)
    check(all(torch.equal(outs[j], make(f"{case}/list/{RANK}", j, [j + RANK + 1], torch.int64).to(dtype))
              for j in range(N)), f"{case} on lists")

# ---- barrier, send/recv ----
dist.barrier()
if N >= 2:
    peer = RANK ^ 1
    if peer < N:
        msg = make(f"p2p/{min(RANK, peer)}", min(RANK, peer), [70001], torch.float32)
        if RANK % 2 == 0:
            dist.send(msg, dst=peer)
            back = torch.empty_like(msg)
            dist.recv(back, src=peer)
            check(torch.equal(back, msg * 2), "send/recv round trip")
        else:
            got = torch.empty_like(msg)
            dist.recv(got, src=peer)
            check(torch.equal(got, msg), "recv")
            dist.send(got * 2, dst=peer)
    # Tags: the recv names the send's tag.
    if peer < N:
        tagged = make(f"p2p-tag/{RANK}", RANK, [33], torch.float64)
        got = torch.empty(33, dtype=torch.float64)
        if RANK % 2 == 0:
            dist.send(tagged, dst=peer, tag=7)
            dist.recv(got, src=peer, tag=8)
        else:
            dist.recv(got, src=peer, tag=7)
            dist.send(tagged, dst=peer, tag=8)
        check(torch.equal(got, make(f"p2p-tag/{peer}", peer, [33], torch.float64)), "send/recv with tags")
    # A ring where every rank isends before it receives (batch_isend_irecv, as ring exchanges
    # use it): with a send that waited for its recv on the caller's thread, this would never end.
    # A large message and a non-contiguous output (staged) among them; across nodes the ring
    # crosses them.
    ring = list(range(N))
    for shape in ([5], [600000]) if len(ring) > 1 else ():
        at = ring.index(RANK)
        nxt, prv = ring[(at + 1) % len(ring)], ring[(at - 1) % len(ring)]
        out = make(f"ring/{shape[0]}/{RANK}", RANK, shape, torch.float32)
        into = torch.empty(shape[0], 2)[:, 1]
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, into, prv)])
        for req in reqs:
            req.wait()
        check(torch.equal(into, make(f"ring/{shape[0]}/{prv}", prv, shape, torch.float32)),
              f"isend before irecv around a ring, {shape[0]} elements")
    # Sends to two peers are independent (as gloo's): rank 0's send to 1 cannot be received
    # before its send to 2 is, since rank 1 first waits for rank 2, which first waits for rank 0.
    # With one thread for all of a group's sends this would never end.
    if len(ring) >= 3:
        a, b, c = ring[:3]
        got = torch.empty(4, dtype=torch.int64)
        if RANK == a:
            reqs = [dist.isend(torch.arange(4) + 10, dst=b), dist.isend(torch.arange(4) + 20, dst=c)]
            for req in reqs:
                req.wait()
        elif RANK == b:
            dist.recv(got, src=c)
            check(torch.equal(got, torch.arange(4) + 30), "recv from the third rank first")
            dist.recv(got, src=a)
            check(torch.equal(got, torch.arange(4) + 10), "then the first rank's send")
        elif RANK == c:
            dist.recv(got, src=a)
            check(torch.equal(got, torch.arange(4) + 20), "the first rank's second send")
            dist.send(torch.arange(4) + 30, dst=b)
    # irecv posted first, then isend, then the waits: the receive does not hold the send back.
    if peer < N:
        back = torch.empty(9, dtype=torch.int64)
        r = dist.irecv(back, src=peer)
        s = dist.isend(torch.arange(9) + RANK, dst=peer)
        r.wait()
        s.wait()
        check(torch.equal(back, torch.arange(9) + peer), "irecv before isend")

# ---- subgroups made by their members alone ----
NNODES = int(os.environ.get("NODAL_NNODES", "1"))
evens = list(range(0, N, 2))
odds = list(range(1, N, 2))
g_even = dist.new_group(evens)  # across nodes (consecutive ranks per node) both span the nodes
g_odd = dist.new_group(odds) if odds else None
mine = evens if RANK % 2 == 0 else odds
group = g_even if RANK % 2 == 0 else g_odd
if NNODES > 1:  # and groups within a node (the shared-memory path)
    L = int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = [list(range(k, k + L)) for k in range(0, N, L)]
    node_groups = [dist.new_group(ranks) for ranks in nodes]
    t = torch.tensor([float(RANK)])
    dist.all_reduce(t, group=node_groups[RANK // L])
    check(t.item() == float(sum(nodes[RANK // L])), f"node group {nodes[RANK // L]}: {t.item()}")
t = torch.tensor([float(RANK)])
dist.all_reduce(t, group=group)
check(t.item() == float(sum(mine)), f"subgroup {mine}: {t.item()}")
b = torch.full((3,), float(RANK))
dist.broadcast(b, src=mine[-1], group=group)
check(torch.equal(b, torch.full((3,), float(mine[-1]))), f"subgroup {mine}: broadcast from {mine[-1]}")
outs = [torch.empty(2) for _ in mine]
dist.all_gather(outs, torch.full((2,), float(RANK)), group=group)
check(all(torch.equal(o, torch.full((2,), float(r))) for o, r in zip(outs, mine)), f"subgroup {mine}: all_gather")
if RANK == 0:  # rank 0 alone in a group of its own
    solo = dist.new_group([0])
    t = torch.tensor([5.0])
    dist.all_reduce(t, group=solo)
    check(t.item() == 5.0, "group of one")
else:
    dist.new_group([0])

# ---- refusals: clear errors on this rank, and the group goes on ----
def refused(fn, words, what):
    try:
        fn()
    except RuntimeError as e:
        check(words in str(e), f"{what}: the message does not say '{words}': {e}")
        return
    check(False, f"{what}: no error")


refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.BAND), "BAND, BOR, BXOR", "BAND")
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int16)), "cannot be reduced", "int16 sum")
refused(lambda: dist.all_reduce(torch.ones(2).to_sparse()), "dense", "sparse tensor")
refused(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool), op=R.AVG), "avg", "bool AVG")
if N > 1:  # this script runs on 2 ranks or more
    refused(lambda: dist.send(torch.ones(1), dst=N), "is not another rank", "send to a rank outside the group")
    refused(lambda: dist.recv(torch.ones(1), src=RANK), "is not another rank", "recv from itself")
    # Tags that differ: the recv does not wait for a later message (the sender waits for this
    # one): UsageError on both sides.
    if RANK ^ 1 < N:
        if RANK % 2 == 0:
            refused(lambda: dist.send(torch.ones(1), dst=RANK ^ 1, tag=3), "tag 3", "send with another tag")
        else:
            refused(lambda: dist.recv(torch.ones(1), src=RANK ^ 1, tag=4), "(tag 4)", "recv of another tag")
    # A call that does not match the others': UsageError on every rank, then the group works on.
    refused(lambda: dist.all_reduce(torch.ones(4 + RANK)), "UsageError", "mismatched allreduce")
t = torch.ones(3)
dist.all_reduce(t)
check(torch.equal(t, torch.full((3,), float(N))), "allreduce after a mismatch")

dist.barrier()
print(f"ops ok: {checks} checks", flush=True)
dist.destroy_process_group()
