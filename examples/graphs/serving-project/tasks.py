"""The work of the serving-project example graph: small, real, verifiable tasks on this machine.

Each subcommand is one task node's work. It runs in the graph's work dir (shared by all nodes),
writes under out/<node>/, and prints one JSON object of metrics as its last stdout line (the
graph runner's metric gates read it). Everything is deterministic (fixed seeds, fixed git
dates) so a re-run after rework or a crash rebuilds the same deliverables.

    python tasks.py <subcommand> [args]      (run by `forge graph run`, not by hand)

Real SGLang where this machine allows it (the default): sync-sglang vendors the source tree of
the pinned release's wheel from the package registry (fetched once into the kit's cache,
`$FORGE_SGLANG_CACHE`, else ~/.cache/infer-forge/sglang; harness/engines/sglang_release.py),
tune-runtime-profile parses the profile's flags with that vendored release's own parser, and
eval-slo-goodput runs the release's own bench client against scripted stand-in servers.
`FORGE_SERVING_PROJECT=fast` keeps the toy parts instead (a two-file SGLang snapshot, flags
checked against the committed flag table, the SLO read off the scheduler simulation): no
SGLang release needed, for the backend-equality test and the benchmarks.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe, Process
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORK = Path(os.environ.get("FORGE_WORKDIR", ".")).resolve()
NODE = os.environ.get("FORGE_NODE", "manual")
OUT = WORK / "out" / NODE
GIT_ENV = {"GIT_AUTHOR_NAME": "forge", "GIT_AUTHOR_EMAIL": "forge@localhost",
           "GIT_COMMITTER_NAME": "forge", "GIT_COMMITTER_EMAIL": "forge@localhost",
           "GIT_AUTHOR_DATE": "2026-11-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-11-01T00:00:00Z"}
# The pinned upstream release, and whether to use the real one (see the module docstring).
SGLANG_VERSION = "0.5.23"
FAST = os.environ.get("FORGE_SERVING_PROJECT", "real") == "fast"
F32P = ctypes.POINTER(ctypes.c_float)
I32P = ctypes.POINTER(ctypes.c_int)


def done(**metrics) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "result.json").write_text(json.dumps(metrics, indent=1, sort_keys=True))
    print(json.dumps(metrics, sort_keys=True))


def sh(*argv: str, cwd: Path | None = None) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def git(repo: Path, *args: str) -> str:
    return sh("git", "-C", str(repo), *args)


def fp(a: np.ndarray):
    return a.ctypes.data_as(F32P)


def ip(a: np.ndarray):
    return a.ctypes.data_as(I32P)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def read(node: str) -> dict:
    return json.loads((WORK / "out" / node / "result.json").read_text())


# --- upstream-sync --------------------------------------------------------------------------

SGLANG = WORK / "repos" / "sglang"
KERNELS = WORK / "repos" / "kernels"


def fresh_repo(path: Path) -> None:
    """Start the repo node over: a MonoRepo member's worktree goes back to the commit the run
    pinned (its `refs/worktree/forge-pin`); a bare folder becomes a new repository."""
    if (path / ".git").is_file():  # a worktree of a MonoRepo member (graph repo node)
        git(path, "reset", "-q", "--hard", "refs/worktree/forge-pin")
        git(path, "clean", "-q", "-fdx")
        return
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")


def commit_all(repo: Path, msg: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)
    return git(repo, "rev-parse", "HEAD")


def vendor_release(repo: Path, version: str) -> dict:
    """Unpack the release's wheel (fetched once from the package registry into the kit's
    cache) under repo/python: its `sglang/` sources, not the compiled extensions (build
    outputs, which upstream's repository does not hold either)."""
    import zipfile

    from infer_forge.harness.engines import sglang_release

    whl = sglang_release.wheel(version)
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist()
                 if n.startswith("sglang/") and not n.endswith((".so", "/"))]
        z.extractall(repo / "python", names)
    return {"wheel": whl.name, "wheel_sha256": hashlib.sha256(whl.read_bytes()).hexdigest(),
            "vendored_files": len(names)}


def vendored_version() -> str:
    """The version string the vendored tree declares (`_version.py`, else `version.py`)."""
    for name in ("_version.py", "version.py"):
        f = SGLANG / "python" / "sglang" / name
        m = re.search(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]",
                      f.read_text()) if f.exists() else None
        if m:
            return m.group(1)
    return ""


def sync_sglang() -> None:
    fresh_repo(SGLANG)
    if FAST:
        srt = SGLANG / "python" / "sglang" / "srt"
        srt.mkdir(parents=True)
        (SGLANG / "python" / "sglang" / "version.py").write_text(
            f'__version__ = "{SGLANG_VERSION}"\n')
        (srt / "server_args.py").write_text("chunked_prefill_size = 8192\n"
                                            "max_running_requests = None\n"
                                            "moe_runner_backend = 'auto'\n")
        info = {"wheel": "", "vendored_files": 2}
        msg = f"upstream sglang v{SGLANG_VERSION} (toy snapshot)"
    else:
        info = vendor_release(SGLANG, SGLANG_VERSION)
        msg = f"upstream sglang v{SGLANG_VERSION} (vendored from {info['wheel']})"
    head = commit_all(SGLANG, msg)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "head.txt").write_text(head + "\n")
    done(files=len(list(SGLANG.rglob("*.py"))), head=head, real=int(not FAST),
         version_matches=int(vendored_version() == SGLANG_VERSION), **info)


def sync_kernels() -> None:
    fresh_repo(KERNELS)
    for c in sorted((HERE / "kernels").glob("*.c")):
        shutil.copy(c, KERNELS / c.name)
    head = commit_all(KERNELS, "kernels: rmsnorm, silu_mul, rope, softmax, topk, fp8, moe_gemm")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "head.txt").write_text(head + "\n")
    done(sources=len(list(KERNELS.glob("*.c"))), head=head)


def sync_patches() -> None:
    # Our patch series on top of upstream: reset to the upstream commit, then re-apply.
    base = (WORK / "out" / "sync-sglang" / "head.txt").read_text().strip()
    git(SGLANG, "reset", "-q", "--hard", base)
    layers = SGLANG / "python" / "sglang" / "srt" / "layers"
    layers.mkdir(exist_ok=True)
    (layers / "__init__.py").write_text("")
    commit_all(SGLANG, "forge: layers package for custom kernels")
    (layers / "moe_config.py").write_text("TOPK = 2\nNUM_EXPERTS = 8\n")
    head = commit_all(SGLANG, "forge: MoE router configuration")
    n = int(git(SGLANG, "rev-list", "--count", f"{base}..HEAD"))
    done(patches=n, head=head)


def sync_lockfile() -> None:
    lock = {}
    for name, repo in (("sglang", SGLANG), ("kernels", KERNELS)):
        tree = git(repo, "ls-tree", "-r", "HEAD")
        lock[name] = {"commit": git(repo, "rev-parse", "HEAD"),
                      "tree_sha256": hashlib.sha256(tree.encode()).hexdigest(),
                      "dirty": bool(git(repo, "status", "--porcelain"))}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "lock.json").write_text(json.dumps(lock, indent=1, sort_keys=True))
    done(repos=len(lock), dirty=sum(v["dirty"] for v in lock.values()))


def check_lockfile() -> None:
    lock = json.loads((WORK / "out" / "sync-lockfile" / "lock.json").read_text())
    for name, repo in (("sglang", SGLANG), ("kernels", KERNELS)):
        tree = git(repo, "ls-tree", "-r", lock[name]["commit"])
        if hashlib.sha256(tree.encode()).hexdigest() != lock[name]["tree_sha256"]:
            sys.exit(f"lock mismatch for {name}")


def sync_rebase_check() -> None:
    # Upstream moves: does our patch series still rebase cleanly onto it?
    tmp = OUT / "clone"
    if tmp.exists():
        shutil.rmtree(tmp)
    OUT.mkdir(parents=True, exist_ok=True)
    sh("git", "clone", "-q", str(SGLANG), str(tmp))
    ours_branch = git(tmp, "rev-parse", "--abbrev-ref", "HEAD")  # the repo node's branch
    base = (WORK / "out" / "sync-sglang" / "head.txt").read_text().strip()
    git(tmp, "checkout", "-q", "-b", "upstream-next", base)
    for name in ("_version.py", "version.py"):  # the file holding the version string
        f = tmp / "python" / "sglang" / name
        if f.exists() and SGLANG_VERSION in f.read_text():
            f.write_text(f.read_text().replace(SGLANG_VERSION, "0.5.24")
                         .replace("(0, 5, 23)", "(0, 5, 24)"))
            break
    commit_all(tmp, "upstream sglang v0.5.24")
    git(tmp, "checkout", "-q", ours_branch)
    rc = subprocess.run(["git", "-C", str(tmp), "rebase", "-q", "upstream-next"],
                        env={**os.environ, **GIT_ENV}, capture_output=True).returncode
    ours = int(git(tmp, "rev-list", "--count", "upstream-next..HEAD"))
    shutil.rmtree(tmp)
    done(rebase_clean=int(rc == 0), patches_carried=ours)


# --- kernel -----------------------------------------------------------------------------------


def build(name: str, opt: str = "-O2", tag: str = "") -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    src = KERNELS / f"{name}.c"
    obj = OUT / f"{name}{tag}.o"
    so = OUT / f"{name}{tag}.so"
    sh("gcc", opt, "-fPIC", "-c", str(src), "-o", str(obj))
    sh("gcc", "-shared", str(obj), "-o", str(so), "-lm")
    return so


def ref_rmsnorm(x, w, eps=1e-6):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * w


def ref_rope(q, base=10000.0):
    s, h, d = q.shape
    half = d // 2
    q = q.astype(np.float64)
    inv = base ** (-2.0 * np.arange(half) / d)
    th = np.arange(s)[:, None] * inv[None, :]
    c, sn = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
    a, b = q[..., :half], q[..., half:]
    return np.concatenate([a * c - b * sn, a * sn + b * c], -1)


def ref_softmax(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_topk(logits, k):
    idx = np.argsort(-logits.astype(np.float64), axis=-1, kind="stable")[:, :k]
    sel = np.take_along_axis(logits.astype(np.float64), idx, -1)
    e = np.exp(sel - sel[:, :1])
    return idx, e / e.sum(-1, keepdims=True)


def massive_activations(n: int = 65536, seed: int = 3) -> np.ndarray:
    """Activations with a few 'massive' outliers (~1e5 x the typical magnitude), as LLM
    residual streams have: the case per-tensor FP8 scaling loses."""
    x = rng(seed).normal(0, 1.0, n).astype(np.float32)
    x[:: n // 8] = 1e5
    return x


def fp8_error(lib, x: np.ndarray, block: int) -> float:
    y = np.empty_like(x)
    scales = np.empty((len(x) + block - 1) // block, np.float32)
    lib.forge_fp8_quant(fp(x), fp(y), fp(scales), len(x), block)
    keep = np.abs(x) < 1e4  # judge the ordinary values, not the outliers themselves
    return float(np.sqrt(((y - x)[keep] ** 2).mean() / (x[keep] ** 2).mean()))


def check_kernel(name: str, lib) -> dict:
    r = rng(1)
    if name == "rmsnorm":
        x, w = r.normal(size=(64, 512)).astype(np.float32), r.normal(size=512).astype(np.float32)
        y = np.empty_like(x)
        lib.forge_rmsnorm(fp(x), fp(w), fp(y), 64, 512, ctypes.c_float(1e-6))
        return {"max_abs_err": float(np.abs(y - ref_rmsnorm(x, w)).max())}
    if name == "silu_mul":
        g, u = (r.normal(size=8192).astype(np.float32) for _ in range(2))
        y = np.empty_like(g)
        lib.forge_silu_mul(fp(g), fp(u), fp(y), len(g))
        g64 = g.astype(np.float64)
        return {"max_abs_err": float(np.abs(y - g64 / (1 + np.exp(-g64)) * u).max())}
    if name == "rope":
        q = r.normal(size=(32, 4, 64)).astype(np.float32)
        ref = ref_rope(q)
        lib.forge_rope(fp(q), 32, 4, 64, ctypes.c_float(10000.0))
        return {"max_abs_err": float(np.abs(q - ref).max())}
    if name == "softmax":
        x = (r.normal(size=(64, 1024)) * 8).astype(np.float32)
        y = np.empty_like(x)
        lib.forge_softmax(fp(x), fp(y), 64, 1024)
        return {"max_abs_err": float(np.abs(y - ref_softmax(x)).max())}
    if name == "topk":
        logits = r.normal(size=(256, 8)).astype(np.float32)
        idx = np.empty((256, 2), np.int32)
        w = np.empty((256, 2), np.float32)
        lib.forge_topk_router(fp(logits), 256, 8, 2, ip(idx), fp(w))
        ridx, rw = ref_topk(logits, 2)
        return {"index_mismatches": int((idx != ridx).sum()),
                "max_abs_err": float(np.abs(w - rw).max())}
    if name == "moe_gemm":
        x = r.normal(size=(32, 16)).astype(np.float32)
        w = r.normal(size=(4, 16, 8)).astype(np.float32)
        e = r.integers(0, 4, 32).astype(np.int32)
        y = np.empty((32, 8), np.float32)
        lib.forge_moe_gemm(fp(x), fp(w), ip(e), fp(y), 32, 16, 8)
        ref = np.einsum("ti,tio->to", x.astype(np.float64), w[e].astype(np.float64))
        return {"max_abs_err": float(np.abs(y - ref).max())}
    raise SystemExit(f"unknown kernel {name}")


def kernel(name: str, block: str = "128") -> None:
    so = build(name)
    lib = ctypes.CDLL(str(so))
    if name == "fp8_quant":
        x = massive_activations()
        done(rel_rms_err=fp8_error(lib, x, int(block) or len(x)), block=int(block))
        return
    done(**check_kernel(name, lib))


# --- communication ------------------------------------------------------------------------


def _ring_rank(rank: int, world: int, data: np.ndarray, left, right, out) -> None:
    """Ring all-reduce: reduce-scatter then all-gather, world-1 steps each."""
    chunks = np.array_split(data.astype(np.float64), world)
    for step in range(world - 1):
        send = (rank - step) % world
        right.send(chunks[send])
        recv = (rank - step - 1) % world
        chunks[recv] = chunks[recv] + left.recv()
    for step in range(world - 1):
        send = (rank + 1 - step) % world
        right.send(chunks[send])
        recv = (rank - step) % world
        chunks[recv] = left.recv()
    out.send(np.concatenate(chunks))


def ring_allreduce(parts: list[np.ndarray]) -> list[np.ndarray]:
    world = len(parts)
    links = [Pipe(duplex=False) for _ in range(world)]  # links[i]: rank i -> rank i+1
    outs = [Pipe(duplex=False) for _ in range(world)]
    procs = [Process(target=_ring_rank, args=(r, world, parts[r], links[(r - 1) % world][0],
                                              links[r][1], outs[r][1])) for r in range(world)]
    for p in procs:
        p.start()
    res = [o[0].recv() for o in outs]
    for p in procs:
        p.join()
    return res


def _gather_rank(rank, world, piece, conns, out):
    got = {rank: piece}
    for peer in range(world):
        if peer != rank:
            conns[peer].send((rank, piece))
    for peer in range(world):
        if peer != rank:
            src, arr = conns[peer].recv()
            got[src] = arr
    out.send(np.concatenate([got[i] for i in range(world)]))


def all_gather(pieces: list[np.ndarray]) -> list[np.ndarray]:
    world = len(pieces)
    mesh = {}
    for a in range(world):
        for b in range(a + 1, world):
            mesh[(a, b)], mesh[(b, a)] = Pipe()
    outs = [Pipe(duplex=False) for _ in range(world)]
    procs = [Process(target=_gather_rank, args=(r, world, pieces[r],
                                                {p: mesh[(r, p)] for p in range(world) if p != r},
                                                outs[r][1])) for r in range(world)]
    for p in procs:
        p.start()
    res = [o[0].recv() for o in outs]
    for p in procs:
        p.join()
    return res


def comm_allreduce() -> None:
    parts = [rng(10 + r).normal(size=4099) for r in range(4)]
    res = ring_allreduce(parts)
    ref = np.sum(parts, axis=0)
    done(world=4, max_abs_err=float(max(np.abs(r - ref).max() for r in res)))


def comm_allgather() -> None:
    pieces = [rng(20 + r).normal(size=1000 + r) for r in range(4)]
    res = all_gather(pieces)
    ref = np.concatenate(pieces)
    done(world=4, mismatched_ranks=sum(not np.array_equal(r, ref) for r in res))


def _topk_lib():
    return ctypes.CDLL(str(WORK / "out" / "kernel-topk-router" / "topk.so"))


def _expert_rank(rank, experts_per_rank, conn):
    # Expert e scales its tokens by (e + 1): a stand-in MLP whose output is checkable.
    batch = conn.recv()
    conn.send([(tok, e, x * (e + 1)) for tok, e, x in batch])


def comm_a2a() -> None:
    lib = _topk_lib()
    tokens, experts, k, world, d = 128, 8, 2, 4, 16
    r = rng(30)
    x = r.normal(size=(tokens, d)).astype(np.float32)
    logits = r.normal(size=(tokens, experts)).astype(np.float32)
    idx = np.empty((tokens, k), np.int32)
    w = np.empty((tokens, k), np.float32)
    lib.forge_topk_router(fp(logits), tokens, experts, k, ip(idx), fp(w))
    per = experts // world
    conns, procs = [], []
    for rank in range(world):
        a, b = Pipe()
        p = Process(target=_expert_rank, args=(rank, per, b))
        p.start()
        conns.append(a)
        procs.append(p)
    batches = [[] for _ in range(world)]
    for t in range(tokens):
        for j in range(k):
            e = int(idx[t, j])
            batches[e // per].append((t, e, x[t]))
    for rank in range(world):
        conns[rank].send(batches[rank])
    y = np.zeros((tokens, d), np.float64)
    wmap = {(t, int(idx[t, j])): float(w[t, j]) for t in range(tokens) for j in range(k)}
    for rank in range(world):
        for t, e, out in conns[rank].recv():
            y[t] += wmap[(t, e)] * out
    for p in procs:
        p.join()
    ref = (x[:, None, :] * ((idx + 1) * w)[:, :, None]).sum(1)
    done(tokens=tokens, dispatched=sum(len(b) for b in batches),
         max_abs_err=float(np.abs(y - ref).max()))


def comm_kv_transfer() -> None:
    """PD disaggregation in miniature: a prefill side streams KV blocks over TCP (127.0.0.1)
    with a sha256 per block; the decode side checks every block and reassembles."""
    blocks = [rng(40 + i).normal(size=4096).astype(np.float32).tobytes() for i in range(64)]
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]

    def prefill() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            for i, b in enumerate(blocks):
                s.sendall(i.to_bytes(4, "big") + len(b).to_bytes(4, "big")
                          + hashlib.sha256(b).digest() + b)

    th = threading.Thread(target=prefill)
    t0 = time.perf_counter()
    th.start()
    conn, _ = srv.accept()
    got, bad = {}, 0
    with conn, conn.makefile("rb") as f:
        while len(got) < len(blocks):
            i, n = int.from_bytes(f.read(4), "big"), int.from_bytes(f.read(4), "big")
            h, b = f.read(32), f.read(n)
            bad += hashlib.sha256(b).digest() != h
            got[i] = b
    th.join()
    dt = time.perf_counter() - t0
    srv.close()
    same = b"".join(got[i] for i in range(len(blocks))) == b"".join(blocks)
    done(blocks=len(blocks), checksum_failures=bad, reassembled_ok=int(same),
         mb_per_s=round(sum(map(len, blocks)) / dt / 1e6, 1))


def comm_bandwidth() -> None:
    a = np.ones(16 * 1024 * 1024 // 8)
    t0 = time.perf_counter()
    for _ in range(20):
        a.copy()
    memcpy = a.nbytes * 20 / (time.perf_counter() - t0) / 1e9
    kv = read("comm-kv-transfer")
    done(memcpy_gb_s=round(memcpy, 2), tcp_mb_s=kv["mb_per_s"],
         alpha_beta_ok=int(memcpy > 0 and kv["mb_per_s"] > 0))


# --- engine-integration -------------------------------------------------------------------

LIB_KERNELS = {"kernel-rmsnorm": "rmsnorm", "kernel-silu-mul": "silu_mul",
               "kernel-rope": "rope", "kernel-softmax": "softmax",
               "kernel-topk-router": "topk", "kernel-fp8-blockwise": "fp8_quant"}


def libforge():
    return ctypes.CDLL(str(WORK / "out" / "engine-kernel-lib" / "libforge.so"))


def engine_kernel_lib() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    objs = [str(WORK / "out" / node / f"{name}.o") for node, name in LIB_KERNELS.items()]
    sh("gcc", "-shared", *objs, "-o", str(OUT / "libforge.so"), "-lm")
    syms = [ln.split()[-1] for ln in sh("nm", "-D", "--defined-only",
                                        str(OUT / "libforge.so")).splitlines()]
    done(symbols=sum(s.startswith("forge_") for s in syms))


def engine_rmsnorm_path() -> None:
    lib = libforge()
    x = rng(50).normal(size=(32, 512)).astype(np.float32)
    w = (1 + 0.1 * rng(51).normal(size=512)).astype(np.float32)
    y = np.empty_like(x)
    lib.forge_rmsnorm(fp(x), fp(w), fp(y), 32, 512, ctypes.c_float(1e-6))
    done(max_abs_err=float(np.abs(y - ref_rmsnorm(x, w)).max()))


def moe_weights(d=32, ff=64, experts=8, seed=60):
    r = rng(seed)
    return (r.normal(size=(d, experts)).astype(np.float32) * 0.5,
            r.normal(size=(experts, d, ff)).astype(np.float32) * 0.2,
            r.normal(size=(experts, d, ff)).astype(np.float32) * 0.2,
            r.normal(size=(experts, ff, d)).astype(np.float32) * 0.2)


def moe_forward(lib, x, wr, wg, wu, wd, k=2, use_lib=True):
    tokens, d = x.shape
    experts = wr.shape[1]
    logits = (x @ wr).astype(np.float32)
    if use_lib:
        idx = np.empty((tokens, k), np.int32)
        w = np.empty((tokens, k), np.float32)
        lib.forge_topk_router(fp(np.ascontiguousarray(logits)), tokens, experts, k, ip(idx), fp(w))
    else:
        idx, w = ref_topk(logits, k)
    y = np.zeros((tokens, d), np.float64)
    for j in range(k):
        for e in range(experts):
            sel = np.nonzero(idx[:, j] == e)[0]
            if not len(sel):
                continue
            g = np.ascontiguousarray((x[sel] @ wg[e]).astype(np.float32))
            u = np.ascontiguousarray((x[sel] @ wu[e]).astype(np.float32))
            if use_lib:
                h = np.empty_like(g)
                lib.forge_silu_mul(fp(g), fp(u), fp(h), g.size)
            else:
                g64 = g.astype(np.float64)
                h = g64 / (1 + np.exp(-g64)) * u
            y[sel] += w[sel, j][:, None] * (h @ wd[e])
    return y


def engine_moe_layer() -> None:
    lib = libforge()
    x = rng(61).normal(size=(64, 32)).astype(np.float32)
    ws = moe_weights()
    y = moe_forward(lib, x, *ws)
    ref = moe_forward(None, x, *ws, use_lib=False)
    done(tokens=64, max_abs_err=float(np.abs(y - ref).max()))


def engine_tp_linear() -> None:
    # Row-parallel linear over 2 ranks: partial products all-reduced with the ring.
    x = rng(70).normal(size=(8, 64))
    w = rng(71).normal(size=(64, 32))
    parts = [(x[:, :32] @ w[:32]).ravel(), (x[:, 32:] @ w[32:]).ravel()]
    out = ring_allreduce(parts)
    ref = (x @ w).ravel()
    done(tp=2, max_abs_err=float(max(np.abs(o - ref).max() for o in out)))


def engine_patch_sglang() -> None:
    layers = SGLANG / "python" / "sglang" / "srt" / "layers"
    (layers / "forge_kernels.py").write_text(
        "import ctypes, os\n"
        "LIB = ctypes.CDLL(os.environ.get('FORGE_KERNELS', 'libforge.so'))\n"
        "rmsnorm = LIB.forge_rmsnorm\nsilu_mul = LIB.forge_silu_mul\n")
    if git(SGLANG, "status", "--porcelain"):
        commit_all(SGLANG, "forge: route rmsnorm/silu_mul through libforge")
    done(commits=int(git(SGLANG, "rev-list", "--count", "HEAD")),
         patched=int("libforge" in git(SGLANG, "log", "--format=%s")))


def engine_tiny_llama() -> None:
    """The embedded engine's model family: a tiny random Llama. Its RMSNorm inputs, run
    through libforge, must match the model's own RMSNorm; greedy decoding must not depend on
    the attention implementation."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, rms_norm_eps=1e-6)
    lib = libforge()
    errs = []

    def hook(mod, inp, out):
        x = inp[0].detach().reshape(-1, inp[0].shape[-1]).float().contiguous().numpy()
        w = mod.weight.detach().float().contiguous().numpy()
        y = np.empty_like(x)
        lib.forge_rmsnorm(fp(x), fp(w), fp(y), x.shape[0], x.shape[1], ctypes.c_float(1e-6))
        errs.append(float(np.abs(y - out.detach().reshape(y.shape).numpy()).max()))

    prompt = torch.tensor([[1, 17, 42, 99, 7, 3]])
    tokens = {}
    for impl in ("sdpa", "eager"):
        cfg._attn_implementation = impl
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).eval()
        hooks = [m.register_forward_hook(hook) for m in model.modules()
                 if type(m).__name__ == "LlamaRMSNorm"] if impl == "sdpa" else []
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        for h in hooks:
            h.remove()
        tokens[impl] = out[0, prompt.shape[1]:].tolist()
    match = sum(a == b for a, b in zip(tokens["sdpa"], tokens["eager"], strict=True)) / 12
    done(rmsnorm_max_err=max(errs), rmsnorm_calls=len(errs), token_match=match)


# --- deployment-tuning --------------------------------------------------------------------


def time_rmsnorm(lib, reps: int = 30) -> float:
    x = rng(80).normal(size=(128, 1024)).astype(np.float32)
    w = np.ones(1024, np.float32)
    y = np.empty_like(x)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        lib.forge_rmsnorm(fp(x), fp(w), fp(y), 128, 1024, ctypes.c_float(1e-6))
        best = min(best, time.perf_counter() - t0)
    return best, y


def tune_opt_level() -> None:
    times, outs = {}, {}
    for opt in ("-O0", "-O1", "-O2", "-O3"):
        lib = ctypes.CDLL(str(build("rmsnorm", opt, tag=opt.replace("-", "_"))))
        times[opt], outs[opt] = time_rmsnorm(lib)
    best = min(times, key=times.get)
    identical = all(np.array_equal(outs["-O0"], o) for o in outs.values())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "choice.json").write_text(json.dumps({"opt": best, "times_s": times}))
    done(choice=best, identical_outputs=int(identical),
         speedup_vs_O0=round(times["-O0"] / times[best], 3))


def tune_moe_batch() -> None:
    lib = libforge()
    ws = moe_weights()
    rates = {}
    for batch in (8, 32, 128):
        x = rng(90).normal(size=(batch, 32)).astype(np.float32)
        t0 = time.perf_counter()
        for _ in range(3):
            moe_forward(lib, x, *ws)
        rates[batch] = 3 * batch / (time.perf_counter() - t0)
    best = max(rates, key=rates.get)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "choice.json").write_text(json.dumps({"batch": best, "tokens_per_s": rates}))
    done(choice=best, best_over_smallest=round(rates[best] / rates[8], 3))


def simulate(chunk: int, rate: float, n: int = 400, seed: int = 5):
    """A tiny chunked-prefill scheduler: Poisson arrivals of prompts (exponential lengths,
    mean 1500 tokens, at most 8192), 64 output tokens each. Each step prefills up to `chunk`
    tokens (0.05 ms/token) and decodes every running request (0.4 ms each), plus 8 ms.
    Big chunks finish prompts sooner (TTFT) but stall decoding (TPOT): the trade-off to tune.
    Returns (TTFT p99 ms, TPOT p99 ms, output tokens/s)."""
    r = rng(seed)
    arrivals = np.cumsum(r.exponential(1000.0 / rate, n))
    lengths = np.minimum(8192, 1 + r.exponential(1500, n).astype(int))
    t, i, queue, running, ttfts, steps, out_tokens = 0.0, 0, [], [], [], [], 0
    while len(ttfts) < n or running:
        while i < n and arrivals[i] <= t:
            queue.append([arrivals[i], int(lengths[i])])
            i += 1
        if not queue and not running:
            t = arrivals[i]
            continue
        budget, step = chunk, 8.0 + 0.4 * len(running)
        done_now = []
        while queue and budget > 0:
            take = min(budget, queue[0][1])
            queue[0][1] -= take
            budget -= take
            step += 0.05 * take
            if queue[0][1] == 0:
                done_now.append(queue.pop(0)[0])
        if running:
            steps.append(step)
        out_tokens += len(running)
        running = [x - 1 for x in running if x > 1]
        t += step
        ttfts += [t - a for a in done_now]
        running += [64] * len(done_now)
    return (float(np.percentile(ttfts, 99)), float(np.percentile(steps, 99)),
            out_tokens / (t / 1000.0))


SLO = {"ttft_p99_ms": 1500.0, "tpot_p99_ms": 60.0}


def tune_chunked_prefill() -> None:
    rate = read("diag-prod-latency")["arrival_rate_per_s"]
    table = {c: simulate(c, rate) for c in (256, 512, 1024, 2048, 4096, 8192)}
    ok = [c for c, v in table.items()
          if v[0] <= SLO["ttft_p99_ms"] and v[1] <= SLO["tpot_p99_ms"]]
    # Largest chunk inside both SLOs: the best TTFT that decoding can afford.
    best = max(ok) if ok else min(table, key=lambda c: table[c][1])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "choice.json").write_text(json.dumps({"chunked_prefill_size": best,
                                                 "table": {str(k): v for k, v in table.items()}}))
    ttft, tpot, tps = table[best]
    done(choice=best, ttft_p99_ms=round(ttft, 1), tpot_p99_ms=round(tpot, 1),
         tokens_per_s=round(tps, 1), candidates_in_slo=len(ok))


def tune_kv_budget() -> None:
    m = read("diag-memory-budget")
    per_req = m["kv_bytes_per_token"] * 4096
    max_running = int(m["kv_pool_bytes"] // per_req)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "choice.json").write_text(json.dumps({"max_running_requests": max_running}))
    done(choice=max_running, fits=int(max_running * per_req <= m["kv_pool_bytes"]))


def tune_runtime_profile() -> None:
    import yaml

    def choice(node):
        return json.loads((WORK / "out" / node / "choice.json").read_text())

    profile = {
        "service": "serving-project", "rev": 2, "engine": "sglang",
        "engine_config": {
            "chunked_prefill_size": choice("tune-chunked-prefill")["chunked_prefill_size"],
            "max_running_requests": choice("tune-kv-budget")["max_running_requests"],
            "moe_runner_backend": "triton",
            "cuda_graph_max_bs_decode": choice("tune-moe-batch")["batch"],
        },
        "build": {"kernels_opt": choice("tune-opt-level")["opt"]},
    }
    path = SGLANG / "profiles" / "serving-project-rev2.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(profile, sort_keys=True))
    if git(SGLANG, "status", "--porcelain"):
        commit_all(SGLANG, "profiles: serving-project rev 2")
    back = yaml.safe_load(path.read_text())
    done(keys=len(back["engine_config"]), rev=back["rev"], **check_flags(back["engine_config"]))


def check_flags(engine_config: dict) -> dict:
    """The profile's engine_config as `sglang.launch_server` flags, parsed by the vendored
    release's own parser (harness/engines/sglang_parser_probe.py, in a child with the tree
    importable; no bytecode written, so the member's tree stays clean); every flag must parse
    and come back with the chosen value. Fast mode: the committed flag table (generated from
    the same parsers) instead."""
    flags = {"--" + k.replace("_", "-"): v for k, v in sorted(engine_config.items())}
    if FAST:
        from infer_forge.harness.engines import sglang_flags
        from infer_forge.harness.errors import HarnessError

        try:
            sglang_flags.check_options(flags, SGLANG_VERSION)
            return {"flags_rejected": 0, "flags_parser": "flag table"}
        except HarnessError as e:
            print(e, file=sys.stderr)
            return {"flags_rejected": 1, "flags_parser": "flag table"}
    from infer_forge.harness.engines import sglang_flags

    argv = ["--model-path", "serving-project"] + [x for f, v in flags.items()
                                                  for x in (f, str(v))]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "argv.json").write_text(json.dumps([argv]))
    r = subprocess.run([sys.executable, "-m", "infer_forge.harness.engines.sglang_import",
                        str(SGLANG / "python"), str(sglang_flags.PROBE), "parse",
                        str(OUT / "argv.json")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if r.returncode != 0:
        sys.exit(f"the vendored SGLang's parser failed: {r.stderr.strip()[-400:]}")
    (res,) = json.loads(r.stdout)
    wrong = [f for f, v in flags.items() if res["args"].get(f[2:].replace("-", "_")) != v]
    if not res["ok"] or wrong:
        print(f"rejected by sglang {vendored_version()}: {res['error'] or wrong}",
              file=sys.stderr)
    return {"flags_rejected": len(wrong) if res["ok"] else len(flags),
            "flags_parser": f"sglang {vendored_version()} (vendored)"}


# --- evaluation ---------------------------------------------------------------------------


def eval_kernel_accuracy() -> None:
    lib = libforge()
    worst = {n: check_kernel(n, lib)["max_abs_err"]
             for n in ("rmsnorm", "silu_mul", "rope", "softmax", "topk")}
    done(worst_err=max(worst.values()), fp8_rel_rms=fp8_error(lib, massive_activations(), 128),
         kernels=len(worst))


def eval_moe_e2e() -> None:
    lib = libforge()
    x = rng(100).normal(size=(16, 32)).astype(np.float32)
    wn = np.ones(32, np.float32)
    h = np.empty_like(x)
    lib.forge_rmsnorm(fp(x), fp(wn), fp(h), 16, 32, ctypes.c_float(1e-6))
    y = moe_forward(lib, h, *moe_weights()) + x
    ref = moe_forward(None, ref_rmsnorm(x, wn).astype(np.float32), *moe_weights(),
                      use_lib=False) + x
    done(max_abs_err=float(np.abs(y - ref).max()), tp_err=read("engine-tp-linear")["max_abs_err"])


def prod_snapshot() -> dict:
    return json.loads((HERE / "prod-endpoint" / "metrics.json").read_text())


def eval_slo_goodput() -> None:
    import yaml

    prof = yaml.safe_load((SGLANG / "profiles" / "serving-project-rev2.yaml").read_text())
    rate = read("diag-prod-latency")["arrival_rate_per_s"]
    tuned = simulate(prof["engine_config"]["chunked_prefill_size"], rate)
    base = simulate(8192, rate)  # the upstream default

    def meets(ttft, tpot):
        return int(ttft <= SLO["ttft_p99_ms"] and tpot <= SLO["tpot_p99_ms"])

    if FAST:  # the SLO read off the scheduler simulation
        done(ttft_p99_ms=round(tuned[0], 1), tpot_p99_ms=round(tuned[1], 1),
             baseline_tpot_p99_ms=round(base[1], 1), meets_slo=meets(*tuned[:2]),
             baseline_meets_slo=meets(*base[:2]), measured_by="simulation")
        return
    got = bench_stand_ins({"tuned": tuned, "baseline": base})
    t, b = got["tuned"], got["baseline"]
    done(ttft_p99_ms=round(t["p99_ttft_ms"], 1), tpot_p99_ms=round(t["p99_tpot_ms"], 1),
         baseline_ttft_p99_ms=round(b["p99_ttft_ms"], 1),
         baseline_tpot_p99_ms=round(b["p99_tpot_ms"], 1),
         meets_slo=meets(t["p99_ttft_ms"], t["p99_tpot_ms"]),
         baseline_meets_slo=meets(b["p99_ttft_ms"], b["p99_tpot_ms"]),
         completed=t["completed"] + b["completed"],
         measured_by=f"sglang {vendored_version()} bench client (vendored)")


BENCH_PROMPTS, BENCH_OUTPUT_LEN = 8, 6


def bench_stand_ins(configs: dict) -> dict:
    """The vendored release's own bench client (`sglang.benchmark.serving`, backend `sglang`)
    against one stand-in server per configuration: the scripted OpenAI-compatible server
    (harness/testing/scripted_server.py, SGLang's native /generate) playing the engine with
    the first-token delay and inter-token gap the scheduler simulation gives that
    configuration (TTFT p99, TPOT p99), as no engine can serve here. {name: the client's
    result line}; every request must complete with BENCH_OUTPUT_LEN tokens."""
    from infer_forge.harness.bench.datasets import small_bpe_tokenizer
    from infer_forge.harness.testing.scripted_server import Script, ScriptedServer

    OUT.mkdir(parents=True, exist_ok=True)
    tok = small_bpe_tokenizer(OUT / "tokenizer")
    data = OUT / "sharegpt.json"
    text = "The quick brown fox jumps over the lazy dog near the river bank at dawn"
    data.write_text(json.dumps([{"id": str(i), "conversations": [
        {"from": "human", "value": f"{text} {i}"}, {"from": "gpt", "value": text}]}
        for i in range(2 * BENCH_PROMPTS)]))
    servers = {name: ScriptedServer(Script(first_token_ms=v[0], itl_ms=v[1])).start_in_thread()
               for name, v in configs.items()}
    outs = {name: OUT / f"bench-{name}.jsonl" for name in configs}
    try:
        argv: list[str] = []
        for name, srv in servers.items():
            outs[name].unlink(missing_ok=True)  # the client appends
            argv += (["+++"] if argv else []) + [
                "--backend", "sglang", "--host", srv.host, "--port", str(srv.port),
                "--model", str(tok), "--tokenizer", str(tok), "--dataset-name", "sharegpt",
                "--dataset-path", str(data), "--num-prompts", str(BENCH_PROMPTS),
                "--sharegpt-output-len", str(BENCH_OUTPUT_LEN), "--output-file", str(outs[name])]
        r = subprocess.run([sys.executable, "-m", "infer_forge.harness.engines.sglang_import",
                            str(SGLANG / "python"), str(HERE / "bench_client.py"), *argv],
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        (OUT / "bench.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0:
            sys.exit(f"the SGLang bench client failed: {r.stderr.strip()[-400:]}")
    finally:
        for srv in servers.values():
            srv.stop()
    got = {}
    for name, out in outs.items():
        (line,) = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        if line["completed"] != BENCH_PROMPTS or \
                line["total_output_tokens"] != BENCH_PROMPTS * BENCH_OUTPUT_LEN:
            sys.exit(f"bench {name}: {line['completed']}/{BENCH_PROMPTS} requests completed, "
                     f"{line['total_output_tokens']} tokens")
        got[name] = line
    return got


def eval_regression() -> None:
    choice = json.loads((WORK / "out" / "tune-opt-level" / "choice.json").read_text())["opt"]
    t_base, _ = time_rmsnorm(ctypes.CDLL(str(build("rmsnorm", "-O0", tag="_base"))))
    t_new, _ = time_rmsnorm(ctypes.CDLL(str(build("rmsnorm", choice, tag="_new"))))
    done(choice=choice, speedup=round(t_base / t_new, 3))


def eval_release_gate() -> None:
    inputs = ["eval-kernel-accuracy", "eval-moe-e2e", "eval-slo-goodput", "eval-regression",
              "sync-rebase-check", "diag-fp8-outliers"]
    record = {n: read(n) for n in inputs}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "release.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    done(inputs=len(record), slo_met=record["eval-slo-goodput"]["meets_slo"],
         rebase_clean=record["sync-rebase-check"]["rebase_clean"])


# --- diagnosis ----------------------------------------------------------------------------


def diag_prod_latency() -> None:
    if FAST:  # the export's samples
        snap = prod_snapshot()["samples"]
        q = np.array([s["queue_depth"] for s in snap], float)
        ttft = np.array([s["ttft_p99_ms"] for s in snap], float)
        rate = float(np.mean([s["arrivals_per_s"] for s in snap]))
        how = {"source": "metrics.json"}
    else:
        q, ttft, rate, how = monitor_prod()
    corr = float(np.corrcoef(q, ttft)[0, 1])
    done(corr_queue_ttft=round(corr, 3), arrival_rate_per_s=round(rate, 2), minutes=len(q),
         root_cause="queueing behind long prefills" if corr > 0.8 else "unknown", **how)


PROD_URL_ENV = "FORGE_PROD_ENDPOINT"
SCRAPES = 60  # one per minute of the replayed hour


def monitor_prod():
    """`forge monitor` the production endpoint (`$FORGE_PROD_ENDPOINT`; unset: the stand-in,
    prod-endpoint/serve.py, started here for the scrapes and stopped after) for SCRAPES
    scrapes, then read its samples back from the ledger (the window's samples artifact).
    Each scrape of the stand-in is one minute of production: (queue depth per scrape, TTFT
    p99 of the requests finished since the previous one, arrivals per second, how)."""
    home = Path(os.environ.get("FORGE_HOME") or WORK.parents[2])  # <home>/graphs/<id>/work
    url = os.environ.get(PROD_URL_ENV, "")
    server = None
    if not url:
        server = subprocess.Popen([sys.executable, str(HERE / "prod-endpoint" / "serve.py"),
                                   "--port", "0"], stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        line = server.stdout.readline()  # `listening on URL` once bound
        if not line.startswith("listening on "):
            server.kill()
            sys.exit(f"the stand-in production endpoint did not start ({server.wait()})")
        url = line.split()[-1]
    try:
        r = subprocess.run([sys.executable, "-m", "infer_forge.cli", "monitor", url,
                            "--interval", "0.05", "--count", str(SCRAPES), "--window", "3600",
                            "--json"], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "FORGE_HOME": str(home)})
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    if r.returncode != 0:
        sys.exit(f"forge monitor {url} failed: {r.stderr.strip()[-400:]}")
    from infer_forge.ledger.samples import decode_samples
    from infer_forge.ledger.workspace import init_workspace

    res = json.loads(r.stdout)
    ws, _ = init_workspace(home)
    with ws:
        cols = [decode_samples(ws.artifacts.get(a))["metrics"] for a in res["artifacts"]]
    m = {k: [v for c in cols for v in c[k]] for k in
         ("num_queue_reqs", "ttft_ms_p99", "num_requests_total")}
    pairs = [(a, b) for a, b in zip(m["num_queue_reqs"], m["ttft_ms_p99"], strict=True)
             if a is not None and b is not None]
    reqs = [x for x in m["num_requests_total"] if x is not None]
    rate = float(np.mean(np.diff(reqs))) / 60.0  # requests per replayed minute, per second
    return (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]), rate,
            {"source": "forge monitor", "scrapes": res["samples"],
             "endpoint": "given" if server is None else "stand-in started here"})


def diag_moe_path() -> None:
    snap = prod_snapshot()["moe_kernel_us_h20"]
    ratio = float(np.median(snap["deep_gemm"]) / np.median(snap["triton"]))
    decision = "reject deep_gemm MoE path on H20" if ratio > 1.0 else "pursue deep_gemm"
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "decision.json").write_text(json.dumps({"decision": decision, "ratio": ratio}))
    done(deep_gemm_over_triton=round(ratio, 3), reject_deep_gemm=int(ratio > 1.0))


def diag_fp8_outliers() -> None:
    lib = ctypes.CDLL(str(WORK / "out" / "kernel-fp8-blockwise" / "fp8_quant.so"))
    x = massive_activations()
    per_tensor, blockwise = fp8_error(lib, x, len(x)), fp8_error(lib, x, 128)
    done(per_tensor_rel_rms=per_tensor, blockwise_rel_rms=blockwise,
         error_ratio=round(per_tensor / blockwise, 2),
         outlier_ratio=float(np.abs(x).max() / np.median(np.abs(x))))


def diag_memory_budget() -> None:
    # A Qwen3-235B-A22B-like point on one H200 node: 8 GPUs of 141 GB, TP 8.
    layers, kv_heads, head_dim, dtype_bytes = 94, 4, 128, 2
    hbm, frac, weights = 141e9 * 8, 0.85, 235e9 * 1.0  # FP8 weights: 1 byte/param
    kv_per_token = 2 * layers * kv_heads * head_dim * dtype_bytes
    pool = hbm * frac - weights
    done(kv_bytes_per_token=kv_per_token, kv_pool_bytes=pool,
         max_tokens=int(pool // kv_per_token))


# --- a Task Loop's evaluator (node tune-kernel-build-loop) ------------------------------------


def loop_eval_kernel_opt(workdir: str) -> None:
    """CommandEvaluator protocol: the candidate arrives as JSON in $FORGE_CANDIDATE; print one
    JSON line of metrics. Throughput = rmsnorm rows/s of the candidate's build; token_match =
    1.0 when its outputs are bit-identical to the -O0 build's."""
    global OUT, KERNELS
    cand = json.loads(os.environ.get("FORGE_CANDIDATE") or "{}")
    opt = cand.get("engine.kernel_opt", "-O0")
    KERNELS = Path(workdir) / "repos" / "kernels"
    OUT = Path(workdir) / "out" / "tune-kernel-build-loop"
    tag = opt.replace("-", "_")
    t, y = time_rmsnorm(ctypes.CDLL(str(build("rmsnorm", opt, tag=tag))), reps=40)
    _, y0 = time_rmsnorm(ctypes.CDLL(str(build("rmsnorm", "-O0", tag="_ref"))), reps=1)
    print(json.dumps({"output_throughput": 128 / t, "median_ttft_ms": t * 1000,
                      "token_match": float(np.array_equal(y, y0)), "completed": 1, "failed": 0}))


COMMANDS = {
    "loop-eval-kernel-opt": loop_eval_kernel_opt,
    "sync-sglang": sync_sglang, "sync-kernels": sync_kernels, "sync-patches": sync_patches,
    "sync-lockfile": sync_lockfile, "check-lockfile": check_lockfile,
    "sync-rebase-check": sync_rebase_check,
    "kernel": kernel,
    "comm-allreduce": comm_allreduce, "comm-allgather": comm_allgather, "comm-a2a": comm_a2a,
    "comm-kv-transfer": comm_kv_transfer, "comm-bandwidth": comm_bandwidth,
    "engine-kernel-lib": engine_kernel_lib, "engine-rmsnorm-path": engine_rmsnorm_path,
    "engine-moe-layer": engine_moe_layer, "engine-tp-linear": engine_tp_linear,
    "engine-patch-sglang": engine_patch_sglang, "engine-tiny-llama": engine_tiny_llama,
    "tune-opt-level": tune_opt_level, "tune-moe-batch": tune_moe_batch,
    "tune-chunked-prefill": tune_chunked_prefill, "tune-kv-budget": tune_kv_budget,
    "tune-runtime-profile": tune_runtime_profile,
    "eval-kernel-accuracy": eval_kernel_accuracy, "eval-moe-e2e": eval_moe_e2e,
    "eval-slo-goodput": eval_slo_goodput, "eval-regression": eval_regression,
    "eval-release-gate": eval_release_gate,
    "diag-prod-latency": diag_prod_latency, "diag-moe-path": diag_moe_path,
    "diag-fp8-outliers": diag_fp8_outliers, "diag-memory-budget": diag_memory_budget,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
