"""SGLang's own bench client (a released wheel's) against servers on 127.0.0.1, for tests.

`run(version, runs)` runs each argument list in `runs` as `python -m sglang.benchmark.serving`
(`sglang.bench_serving` before 0.5.15, a deprecated alias after) in ONE child process with
that release importable (tests/data/sglang/golden/bench/run_bench_client.py under the
kit), and returns its output.
`args(...)` is one run's command line: a local tokenizer directory, a local ShareGPT-format
file (`sharegpt(path)`; the client's `random` dataset would download ShareGPT), fixed output
lengths, `--output-file`. `stand_in()` starts tests/data/sglang/fake_server.py on a free port.

RUNS names, per release, the runs the tests make and the golden files hold (one committed
output line per run, tests/data/sglang/golden/bench/sglang-VERSION.jsonl):
`python -m tests.helpers.real_bench_client golden VERSION ...` (from the checkout) regenerates
them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from . import real_sglang

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "data" / "sglang" / "golden" / "bench"
DRIVER = GOLDEN / "run_bench_client.py"
FAKE_SERVER = REPO / "tests" / "data" / "sglang" / "fake_server.py"
PROMPTS = 8
OUTPUT_LEN = 6  # not the stand-in's old default of 8, so an ignored limit shows

_TEXTS = ("The quick brown fox jumps over the lazy dog and runs far away into the woods",
          "Water boils at 100 degrees Celsius at sea level on a normal sunny day",
          "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod",
          "def f(x): return x * 2 + 1, and then we call it with ten and print it")


# release -> [(run name, --backend, server: "stand-in" or "scripted", extra flags)]
RUNS: dict[str, list[tuple[str, str, str, tuple[str, ...]]]] = {
    "0.5.23": [
        ("native", "sglang", "stand-in", ()),
        ("completions", "sglang-oai", "stand-in", ()),
        ("chat", "sglang-oai-chat", "stand-in",
         ("--cache-report", "--goodput", "ttft:60000", "tpot:60000")),
        ("native-scripted", "sglang", "scripted", ()),
    ],
    "0.5.6": [
        ("native", "sglang", "stand-in", ()),
        ("completions", "sglang-oai", "stand-in", ()),
        ("chat", "sglang-oai-chat", "stand-in", ()),
    ],
    "0.5.1": [
        ("native", "sglang", "stand-in", ()),
        ("completions", "sglang-oai", "stand-in", ()),
        ("chat", "sglang-oai-chat", "stand-in", ()),
    ],
    "0.4.0": [  # no chat backend in 0.4.0's client
        ("native", "sglang", "stand-in", ()),
        ("completions", "sglang-oai", "stand-in", ()),
    ],
}

NO_DETAILS = {"0.4.0"}  # its client has no --output-details


def run_release(version: str, urls: dict[str, str], tokenizer: Path, dataset: Path,
                out_dir: Path) -> tuple[dict[str, Path], str]:
    """Every run of RUNS[version] in one child: {run name: its --output-file}, and the
    client's output."""
    outs = {name: out_dir / f"{version}-{name}.jsonl" for name, *_ in RUNS[version]}
    for f in outs.values():
        f.unlink(missing_ok=True)  # the client appends
    details = () if version in NO_DETAILS else ("--output-details",)  # per-request arrays
    runs = [args(urls[server], backend, tokenizer, dataset, outs[name], *details, *extra)
            for name, backend, server, extra in RUNS[version]]
    return outs, run(version, runs)


def run_releases(versions: tuple[str, ...], tokenizer: Path, tmp: Path
                 ) -> dict[str, tuple[dict[str, Path], str]]:
    """`run_release` of each release against one stand-in server, the releases at once (one
    child process each); {version: (outputs, log)}."""
    data = sharegpt(tmp / "sharegpt.json")
    with stand_in() as url, ThreadPoolExecutor(len(versions)) as pool:
        jobs = {v: pool.submit(run_release, v, {"stand-in": url}, tokenizer, data, tmp)
                for v in versions}
        return {v: job.result() for v, job in jobs.items()}


def key_shape(obj: object) -> object:
    """What a golden comparison holds: the keys, nested for objects (server_info: only that it
    is an object or null, as its content is the server's), and the kind of each value."""
    if isinstance(obj, dict):
        return {k: ("object" if k == "server_info" and isinstance(v, dict) else key_shape(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return "list"
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return type(obj).__name__
    return "number"


def check_completed(outs: dict[str, Path], log: str, version: str) -> None:
    """Every run's every request succeeded with exactly OUTPUT_LEN tokens, streamed per
    token (one ITL per token after the first, where the release writes details)."""
    assert "Traceback" not in log
    for name, out in outs.items():
        (line,) = lines(out)
        assert line["completed"] == PROMPTS, (version, name, line.get("errors"))
        assert line["total_output_tokens"] == PROMPTS * OUTPUT_LEN, (version, name)
        if version not in NO_DETAILS:
            assert not any(line["errors"]), (version, name)
            assert [len(x) for x in line["itls"]] == [OUTPUT_LEN - 1] * PROMPTS, name
            # The stand-in echoes the prompt: exactly OUTPUT_LEN words each.
            assert {len(t.split()) for t in line["generated_texts"]} == {OUTPUT_LEN}, name


def check_golden(outs: dict[str, Path], version: str) -> None:
    """Each run wrote the keys of the committed golden line (nested, with their kinds)."""
    golden = lines(GOLDEN / f"sglang-{version}.jsonl")
    assert len(golden) == len(RUNS[version])
    for (name, *_), want in zip(RUNS[version], golden, strict=True):
        (got,) = lines(outs[name])
        assert key_shape(got) == key_shape(want), (version, name)


def sharegpt(path: Path, n: int = 16) -> Path:
    """A ShareGPT-format file (`conversations` of human/gpt turns) of `n` conversations."""
    rows = [{"id": str(i), "conversations": [
        {"from": "human", "value": _TEXTS[i % len(_TEXTS)]},
        {"from": "gpt", "value": _TEXTS[(i + 1) % len(_TEXTS)]}]} for i in range(n)]
    path.write_text(json.dumps(rows))
    return path


def args(base_url: str, backend: str, tokenizer: Path, dataset: Path, out: Path,
         *extra: str) -> list[str]:
    host, port = base_url.rsplit("/", 1)[-1].rsplit(":", 1)
    return ["--backend", backend, "--host", host, "--port", port, "--model", str(tokenizer),
            "--tokenizer", str(tokenizer), "--dataset-name", "sharegpt", "--dataset-path",
            str(dataset), "--num-prompts", str(PROMPTS), "--sharegpt-output-len",
            str(OUTPUT_LEN), "--output-file", str(out), *extra]


def run(version: str, runs: list[list[str]], timeout: float = 240) -> str:
    """The client's standard output for every run (one child process for all of them)."""
    flat: list[str] = []
    for i, a in enumerate(runs):
        flat += (["+++"] if i else []) + a
    return real_sglang.run(version, DRIVER, *flat, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@contextmanager
def stand_in(*flags: str) -> Iterator[str]:
    """tests/data/sglang/fake_server.py on a free port of 127.0.0.1; yields its base URL."""
    p = subprocess.Popen([sys.executable, str(FAKE_SERVER), "--model-path", "tiny", "--host",
                          "127.0.0.1", "--port", "0", *flags], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:  # the server_args line, then the one saying where it listens
            if "Uvicorn running on " in line:
                url = line.split("Uvicorn running on ")[1].strip()
                break
        else:
            raise RuntimeError(f"the stand-in server exited with {p.wait()}")
        # Keep reading its log so its pipe never fills.
        import threading

        threading.Thread(target=p.stdout.read, daemon=True).start()
        yield url
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str]) -> int:
    """`golden VERSION ...`: rerun RUNS[VERSION] and rewrite its golden file."""
    if len(argv) < 2 or argv[0] != "golden":
        print("usage: python -m tests.helpers.real_bench_client golden VERSION ...",
              file=sys.stderr)
        return 2
    import tempfile

    from infer_forge.harness.bench.datasets import small_bpe_tokenizer
    from infer_forge.harness.testing.scripted_server import ScriptedServer

    with tempfile.TemporaryDirectory() as tmp, stand_in() as url, ScriptedServer() as scripted:
        t = Path(tmp)
        tok, data = small_bpe_tokenizer(t / "tok"), sharegpt(t / "sharegpt.json")
        for version in argv[1:]:
            outs, _ = run_release(version, {"stand-in": url, "scripted": scripted.url}, tok,
                                  data, t)
            golden = GOLDEN / f"sglang-{version}.jsonl"
            golden.write_text("".join(outs[name].read_text() for name, *_ in RUNS[version]))
            print(golden)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
