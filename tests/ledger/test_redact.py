# ruff: noqa: E501  (the SGLang log sample keeps its real line lengths)
"""Redaction: every provider rule fires on a real-shaped token, through both the short-string
and the long-log paths; ordinary SGLang server logs pass untouched; and, end to end, secrets
planted in tool calls, artifacts, notes, configured env vars and files never reach the bytes
of the ledger file or the artifact store."""

from __future__ import annotations

import random
import re

import orjson
import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.secrets.names import (
    NAMED_SECRET_TAG as NAMED,
)
from infer_forge.ledger.secrets.names import (
    env_secret_values,
    is_secret_name,
    redact_assignments,
)
from infer_forge.ledger.secrets.patterns import plugin_rules
from infer_forge.ledger.secrets.redactor import Redactor, secret_values_from
from infer_forge.ledger.store import Append
from infer_forge.ledger.workspace import init_workspace, open_workspace

from tests.conftest import run_forge

H40 = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
HEX64 = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d"
ALNUM36 = "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n"
       "-----END RSA PRIVATE KEY-----")

# (text containing a secret, the secret part that must disappear)
SAMPLES: list[tuple[str, str]] = [
    ("export HF_TOKEN=hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "hf_aBcDeFgHiJkLmNoPqRs"),
    ("key id AKIAIOSFODNN7EXAMPLQ in use", "AKIAIOSFODNN7EXAMPLQ"),
    (f"aws_secret_access_key = {H40}", H40),
    (f"aws_key = '{H40}'", H40),
    ("AKCp8kqTo5CDY2Gu8XdKbsfM9m3x8H3iKoo3mk6GkDoNEuPkBQS5TSk2M6KS4xRwLLx1jL end",
     "AKCp8kqTo5CDY2Gu8XdKbsfM9m3x8H3"),
    ("password=AP6xxxxxxxxxx1234 ", "AP6xxxxxxxxxx1234"),
    ("DefaultEndpointsProtocol=https;AccountKey=" + "A" * 86 + "==", "A" * 86),
    ("pg: postgresql://forge:S3cretPassw0rd@db.internal:5432/forge", "S3cretPassw0rd"),
    (f"cloudant_password='{HEX64}'", HEX64),
    (f"https://user:{HEX64}@acct.cloudant.com", HEX64),
    ("cl_key = qwertyuiopasdfghjklzxcvb", "qwertyuiopasdfghjklzxcvb"),
    ("https://user:mnbvcxzlkjhgfdsapoiuytre@acct.cloudant.com", "mnbvcxzlkjhgfdsapoiuytre"),
    ("bot MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs", "ZnCjm1XVW7vRze4b7Cq4se7kKWs"),
    (f"token ghp_{ALNUM36}", ALNUM36),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz"),
    ("glpat-aBcDeFgHiJkLmNoPqRsT", "aBcDeFgHiJkLmNoPqRsT"),
    ("GR1348941aBcDeFgHiJkLmNoPqRsT", "aBcDeFgHiJkLmNoPqRsT"),
    ("glcbt-1a_aBcDeFgHiJkLmNoPqRsT", "aBcDeFgHiJkLmNoPqRsT"),
    ("glimt-" + "x9Y8z" * 5, "x9Y8z" * 5),
    ("glptt-" + "x9Y8z" * 8, "x9Y8z" * 8),
    ("glagent-" + "x9Y8z" * 10, "x9Y8z" * 10),
    ("gloas-" + "x9Y8" * 16, "x9Y8" * 16),
    ("ibm_cloud_iam_api_key = abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH",
     "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"),
    ("cos_hmac_secret_access_key = '" + "a1" * 24 + "'", "a1" * 24),
    ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
     "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV"),
    ("0123456789abcdef0123456789abcdef-us12", "0123456789abcdef0123456789abcdef"),
    (f"//registry.npmjs.org/:_authToken=npm_{ALNUM36}", ALNUM36),
    (f"NPM_TOKEN=npm_{ALNUM36}", ALNUM36),
    ("sk-abcdefghij0123456789T3BlbkFJabcdefghij0123456789", "T3BlbkFJabcdefghij"),
    ("OPENAI_API_KEY=sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78St90", "Ab12Cd34Ef56Gh78Ij90"),
    ("ANTHROPIC_API_KEY=sk-ant-api03-" + "Zx9" * 30, "Zx9Zx9Zx9Zx9"),
    (f"key file:\n{PEM}\nnext line", "MIIEowIBAAKCAQEAu1SU1LfV"),
    ("PuTTY-User-Key-File-2: ssh-rsa\nEncryption: none\nPrivate-Lines: 1\nAAAAgQC0secretbits\n"
     "Private-MAC: 3a4b5c", "AAAAgQC0secretbits"),
    *(
        (f"-----BEGIN {kind} PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmU\n"
         f"-----END {kind} PRIVATE KEY-----", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU")
        for kind in ("OPENSSH", "DSA", "EC", "SSH2 ENCRYPTED")
    ),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
     "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQOYBF0w1qUBCADd\n-----END PGP PRIVATE KEY BLOCK-----",
     "lQOYBF0w1qUBCADd"),
    ("pypi-AgEIcHlwaS5vcmc" + "x1Y2" * 18, "x1Y2x1Y2x1Y2"),
    ("pypi-AgENdGVzdC5weXBpLm9yZw" + "x1Y2" * 18, "x1Y2x1Y2x1Y2"),
    ("SG." + "a" * 22 + "." + "b" * 43, "b" * 43),
    ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "AbCdEfGhIjKlMnOpQrStUvWx"),
    ("https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
     "XXXXXXXXXXXXXXXXXXXXXXXX"),
    ("softlayer_api_key = " + "ab12" * 16, "ab12" * 16),
    ("https://api.softlayer.com/soap/v3/" + "cd34" * 16, "cd34" * 16),
    ("sq0csp-" + "Q" * 43, "Q" * 43),
    ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("rk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
    ("110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawx", "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawx"),
    ("AC" + "a1b2" * 8, "a1b2" * 8),
    ("SK" + "c3d4" * 8, "c3d4" * 8),
    ("key=AIzaSyA1234567890abcdefghijklmnopqrstuv", "SyA1234567890abcdefghijkl"),
    ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345", "abcdefghijklmnopqrstuvwxyz012345"),
]

# A realistic SGLang server log: launch args, weights, KV cache, CUDA graphs, uvicorn access
# lines, batch stats, request ids, digests, URLs, a traceback, metrics, a bench command.
SGLANG_LOG = r"""[2026-11-29 10:00:01] server_args=ServerArgs(model_path='Qwen/Qwen3-30B-A3B-Instruct-2507', tokenizer_path='Qwen/Qwen3-30B-A3B-Instruct-2507', tokenizer_mode='auto', load_format='auto', trust_remote_code=False, dtype='auto', kv_cache_dtype='auto', quantization=None, device='cuda', host='0.0.0.0', port=30000, mem_fraction_static=0.871, chunked_prefill_size=8192, max_prefill_tokens=16384, schedule_policy='fcfs', page_size=1, tp_size=4, pp_size=1, ep_size=4, random_seed=193748501, watchdog_timeout=300, log_level='info', enable_metrics=True, api_key=None, file_storage_path='sglang_storage', dp_size=1, load_balance_method='round_robin', json_model_override_args='{}', attention_backend='fa3', sampling_backend='flashinfer', grammar_backend='xgrammar', moe_runner_backend='deep_gemm', moe_a2a_backend='deepep', deepep_mode='auto', cuda_graph_max_bs_decode=256, enable_torch_compile=False, disaggregation_mode='null', disaggregation_transfer_backend='mooncake')
[2026-11-29 10:00:03] Using default HuggingFace chat template with detected content format: string
[2026-11-29 10:00:05 TP0] Attention backend not set. Use fa3 backend by default.
[2026-11-29 10:00:06 TP0] sglang is using nccl==2.27.3
[2026-11-29 10:00:07 TP0] Load weight begin. avail mem=138.21 GB
[2026-11-29 10:00:07 TP1] Using model weights format ['*.safetensors']
Loading safetensors checkpoint shards:  31% Completed | 5/16 [00:04<00:09,  1.19it/s]
[2026-11-29 10:00:19 TP0] Load weight end. type=Qwen3MoeForCausalLM, dtype=torch.bfloat16, avail mem=123.84 GB, mem usage=14.37 GB.
[2026-11-29 10:00:19 TP0] KV Cache is allocated. #tokens: 2413292, K size: 55.24 GB, V size: 55.24 GB
[2026-11-29 10:00:20 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256]
Capturing batches (bs=256 avail_mem=11.80 GB):   3%|▎         | 1/35 [00:00<00:21,  1.58it/s]
[2026-11-29 10:00:33 TP0] Capture cuda graph end. Time elapsed: 13.02 s. mem usage=0.81 GB. avail mem=11.12 GB.
[2026-11-29 10:00:34 TP0] max_total_num_tokens=2413292, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=4096, context_len=262144, available_gpu_mem=11.12 GB
[2026-11-29 10:00:35] INFO:     Started server process [48213]
[2026-11-29 10:00:35] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)
[2026-11-29 10:00:36] INFO:     127.0.0.1:51234 - "GET /get_model_info HTTP/1.1" 200 OK
[2026-11-29 10:00:36 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0,
[2026-11-29 10:00:37] The server is fired up and ready to roll!
[2026-11-29 10:01:02 TP0] Prefill batch. #new-seq: 32, #new-token: 32768, #cached-token: 1024, token usage: 0.01, #running-req: 0, #queue-req: 96, input throughput (token/s): 41233.17
[2026-11-29 10:01:04 TP0] Decode batch. #running-req: 128, #token: 139264, token usage: 0.06, cuda graph: True, gen throughput (token/s): 6121.88, #queue-req: 0,
[2026-11-29 10:01:04] INFO:     10.0.3.17:40522 - "POST /v1/chat/completions HTTP/1.1" 200 OK
[2026-11-29 10:01:05 TP0] Receive: obj=GenerateReqInput(rid='8d5b3f0c2a9e4e7fb1c2d3e4f5a6b7c8', text='Summarize the attached report', stream=True, return_logprob=False)
[2026-11-29 10:01:05 TP0] Finish: obj=GenerateReqInput(rid='8d5b3f0c2a9e4e7fb1c2d3e4f5a6b7c8'), out={'meta_info': {'id': '8d5b3f0c2a9e4e7fb1c2d3e4f5a6b7c8', 'finish_reason': {'type': 'length', 'length': 1024}, 'prompt_tokens': 1024, 'completion_tokens': 1024, 'cached_tokens': 0, 'e2e_latency': 7.214}}
[2026-11-29 10:01:06 TP2] [fused_moe] using default config for E=128, N=768, device_name=NVIDIA_H200, dtype=fp8_w8a8, block_shape=[128, 128]: /sgl-workspace/sglang/python/sglang/srt/layers/moe/fused_moe_triton/configs/triton_3_4_0/E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json
[2026-11-29 10:01:08] image: lmsysorg/sglang@sha256:4f9c2a1b7e3d5c6a8b0e1f2d3c4b5a69788796a5b4c3d2e1f0a9b8c7d6e5f4a3 commit 7c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d
[2026-11-29 10:01:08] Downloading https://huggingface.co/Qwen/Qwen3-30B-A3B-Instruct-2507/resolve/main/config.json to /root/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B-Instruct-2507/snapshots/0d7cf23991f47feeb3a57ecb4c9cee8ea4a17bfe/config.json
[2026-11-29 10:01:09 TP3] WARNING: Overlap scheduler is disabled because of using eagle speculative decoding. mooncake transfer engine session 10.0.3.21:17001 ready, rdma device mlx5_0 gid_index=3
[2026-11-29 10:01:10] Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2891, in run_scheduler_process
    scheduler.event_loop_overlap()
RuntimeError: CUDA error: an illegal memory access was encountered (cudaErrorIllegalAddress) at 0x7f3a2c000000 stream=0x55d1e2a3b4c0
[2026-11-29 10:01:11] nvidia-smi: GPU-8f3b2c1d-4e5a-6b7c-8d9e-0f1a2b3c4d5e 81559MiB / 143771MiB 100% P0 700W
[2026-11-29 10:01:12] sglang:time_to_first_token_seconds_bucket{model_name="Qwen/Qwen3-30B-A3B-Instruct-2507",le="0.25"} 1532.0 sglang:gen_throughput 6121.88 eplb_balancedness 0.9312 kv_transfer_latency_ms 3.18
[2026-11-29 10:01:13] python3 -m sglang.bench_serving --backend sglang --dataset-name random --random-input-len 1024 --random-output-len 1024 --random-range-ratio 1.0 --max-concurrency 128 --num-prompts 512 --seed 42 --output-file /data/run-3fa2c1.jsonl
{"backend": "sglang", "dataset_name": "random", "request_rate": Infinity, "max_concurrency": 128, "duration": 98.21, "completed": 512, "total_input_tokens": 524288, "output_throughput": 5337.9, "mean_ttft_ms": 812.4, "p99_ttft_ms": 2210.9, "mean_tpot_ms": 22.1, "mean_itl_ms": 22.0, "concurrency": 121.7}
"""


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor(["v4lue-Of-My-Service-Token-9f8e7d"])


def test_samples_cover_every_rule():
    for rule in plugin_rules():
        assert any(rule.pattern.search(text) for text, _ in SAMPLES), rule.label


@pytest.mark.parametrize(("text", "secret"), SAMPLES, ids=[s[1][:12] for s in SAMPLES])
def test_every_rule_redacts_as_short_string_and_inside_a_long_log(redactor, text, secret):
    assert secret in text
    short = redactor.text(text)
    assert secret not in short and "[REDACTED:" in short
    # Inside a long log (the region path): at the start, in the middle and at the end.
    for log in (text + "\n" + SGLANG_LOG * 8, SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG * 4,
                SGLANG_LOG * 8 + text):
        assert len(log) > 8192
        out = redactor.text(log)
        assert secret not in out
        assert out.replace(short, "") == log.replace(text, ""), "only the secret changed"
    assert secret not in orjson.dumps(redactor.value({"argv": ["x", text], text: 1})).decode()
    # The whole-event screen on JSON bytes (how events are written) must trip on it too.
    doc = orjson.dumps({"argv": ["x", text], "note": f'said "{text}"'})
    assert redactor.might_contain_secret_bytes(doc)
    assert secret.encode() not in redactor.json_bytes(doc)


def test_configured_values_are_redacted_wherever_they_appear():
    value = 'pa"ss\\word-Zq8Wm2Lp4Xr6'
    r = Redactor([value, "abc"])  # values under 6 characters would redact ordinary words
    assert r.text(f"--password={value} --user abc") == (
        "--password=[REDACTED:configured-secret] --user abc")
    doc = orjson.dumps({"argv": ["--password", value]})
    assert value.encode() not in r.json_bytes(doc) and b"Zq8Wm2" not in r.json_bytes(doc)
    assert r.json_bytes(b'{"a": 1}') == b'{"a": 1}'
    big = SGLANG_LOG * 5 + value + "\n"
    assert "Zq8Wm2" not in r.text(big)


def test_secret_values_from_env_and_files(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_TEST_TOKEN", "env-secret-123456")
    f = tmp_path / "creds"
    f.write_text("line-one-secret-1\nline-two-secret-2\n")
    values = secret_values_from(["FORGE_TEST_TOKEN", "FORGE_UNSET_VAR"], [f, tmp_path / "nope"])
    assert "env-secret-123456" in values
    assert {"line-one-secret-1", "line-two-secret-2"} <= set(values)


def test_ordinary_sglang_server_log_passes_untouched(redactor):
    assert redactor.text(SGLANG_LOG) is SGLANG_LOG
    big = SGLANG_LOG * 20
    assert redactor.text(big) is big
    for line in SGLANG_LOG.splitlines():
        assert redactor.text(line) is line, line
    value = {"log": SGLANG_LOG.splitlines(), "digest": "sha256:" + HEX64}
    assert redactor.value(value) == value


def test_non_ascii_and_crlf_logs(redactor):
    log = ("[2026-11-29 10:00:00] progress ███▎ 42% — ok\r\n" * 400
           + "token ghp_" + ALNUM36 + "\r\n" + "▎ done ✓\r\n" * 400)
    out = redactor.text(log)
    assert ALNUM36 not in out and "▎ done ✓" in out and out.count("\r\n") == log.count("\r\n")


# --- end to end: planted secrets never reach the ledger or the artifacts ----------------------

ENV_SECRET = "v4lue-Of-My-Service-Token-9f8e7d"
FILE_SECRET = "file-secret-Zq8Wm2Lp4Xr6"
HF = "hf_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVb"
GH = "ghp_" + ALNUM36
OPENAI = "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl12Mn34Op56Qr78St90"
AWS = "AKIAIOSFODNN7EXAMPLQ"
PG_PASSWORD = "S3cretPassw0rd"
SLACK = "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx"
PLANTED = [ENV_SECRET, FILE_SECRET, HF, GH, OPENAI, AWS, PG_PASSWORD, SLACK,
           "MIIEowIBAAKCAQEAu1SU1LfV"]


def test_planted_secrets_are_absent_from_ledger_file_and_artifacts(forge_home, tmp_path,
                                                                   monkeypatch):
    secret_file = tmp_path / "service.secret"
    secret_file.write_text(FILE_SECRET + "\n")
    monkeypatch.setenv("MY_SERVICE_TOKEN", ENV_SECRET)
    ws, _ = init_workspace(forge_home)
    ws.close()
    cfg = forge_home / "forge.toml"
    text = cfg.read_text()
    text = re.sub(r"(?m)^env = .*$", 'env = ["MY_SERVICE_TOKEN", "HF_TOKEN"]', text)
    text = text.replace("files = []", f'files = ["{secret_file}"]')
    cfg.write_text(text)

    with open_workspace(forge_home) as ws:
        stdout = ws.artifacts.put(
            f"{SGLANG_LOG}using {ENV_SECRET} and {FILE_SECRET}\nHF_TOKEN={HF}\n{PEM}\n"
            f"connect postgresql://forge:{PG_PASSWORD}@db:5432/forge\n" + SGLANG_LOG)
        small = ws.artifacts.put(f"token={GH}")
        ws.ledger.save(Append("task:leak", [
            E.TaskDefined(task_id="leak", title="t", task_type="x", goal=f"use {OPENAI}",
                          definition={"env": {"OPENAI_API_KEY": OPENAI, AWS: "as a key"}},
                          definition_hash="sha256:" + HEX64),
            E.ToolInvoked(task_id="leak", block_id="b1", tool="launch",
                          argv=["python", "-m", "sglang.launch_server", "--api-key", ENV_SECRET,
                                f"--hf-token={HF}", f"--db=postgresql://u:{PG_PASSWORD}@h/db"],
                          stdout_digest=stdout, stderr_digest=small, error=f"failed: {SLACK}"),
            E.LoopBlockHandedOff(task_id="leak", block_id="b1", state_reached=f"key {FILE_SECRET}",
                                 findings=[f"the server printed {GH}", f"aws {AWS}", PEM],
                                 next_sub_goal=f"rotate {ENV_SECRET}"),
            E.MeasurementRecorded(task_id="leak", block_id="b1", run_id="r1", source="t",
                                  metrics={"x": 1.0}, meta={"note": f"Bearer {OPENAI}"}),
        ]))
        assert ws.artifacts.text(stdout).count("[REDACTED:") >= 5
        files = [p for p in forge_home.rglob("*") if p.is_file() and p.name != "forge.toml"]
        assert any(p.name == "ledger.sqlite-wal" for p in files)  # events still in the WAL
        raw = b"".join(p.read_bytes() for p in files)
        for secret in PLANTED:
            assert secret.encode() not in raw, secret
        assert b"[REDACTED:" in raw and b"sglang.launch_server" in raw
    # After close (WAL checkpointed into the main file), and through the CLI export.
    raw = b"".join(p.read_bytes() for p in forge_home.rglob("*")
                   if p.is_file() and p.name != "forge.toml")
    export = run_forge("events", "export", home=forge_home,
                       env={"MY_SERVICE_TOKEN": ENV_SECRET})
    assert export.returncode == 0, export.stderr
    for secret in PLANTED:
        assert secret.encode() not in raw, secret
        assert secret not in export.stdout, secret
    assert "--api-key" in export.stdout


def test_a_reader_compiles_no_redactor_and_a_writer_redacts_the_values_seen_at_open(
        forge_home, monkeypatch):
    # Reading (forge task list, log, memory) never redacts: the redactor's patterns compile
    # at the first write (issue 36, start-up time). The secret values are those of open.
    init_workspace(forge_home)[0].close()
    monkeypatch.setenv("MY_SERVICE_TOKEN", ENV_SECRET)
    with open_workspace(forge_home) as ws:
        monkeypatch.delenv("MY_SERVICE_TOKEN")  # gone before the first write: still secret
        assert list(ws.ledger.events()) != []  # init's events, read
        assert "redactor" not in vars(ws.ledger)
        digest = ws.artifacts.put(f"the server said {ENV_SECRET}")
        assert "redactor" in vars(ws.ledger)  # the artifacts share the ledger's redactor
        assert ENV_SECRET not in ws.artifacts.text(digest)
        ws.ledger.save(Append("task:late", [E.TaskDefined(
            task_id="late", title="t", task_type="x", goal=f"use {ENV_SECRET}",
            definition={}, definition_hash="sha256:" + HEX64)]))
        goal = ws.ledger.stream("task:late")[0].event.goal
    assert ENV_SECRET not in goal and "[REDACTED:" in goal


# --- secret names: one rule for the env digest, mapping keys, flags and NAME=value text -------

SECRET_NAMES = ["AWS_SECRET_ACCESS_KEY", "MY_API_KEY", "HF_TOKEN", "apiKey", "x-api-key",
                "--api-key", "PGPASSWORD", "db.password", "config.env.AWS_SECRET_ACCESS_KEY",
                "client_secret", "SECRET_KEY_BASE", "GITHUB_PAT", "Authorization", "auth",
                "TOKEN", "OAuthToken", "accessToken", "SLACK_BOT_TOKEN", "credentials",
                "MYSQL_PWD", "API_KEY_2", "apikey", "authtoken", "passphrase", "db_passwd"]
ORDINARY_NAMES = ["KEYBOARD", "max_tokens", "num_tokens", "max_new_tokens",
                  "TOKENIZERS_PARALLELISM", "bos_token", "eos_token", "pad_token_id",
                  "time_to_first_token", "sort_key", "public_key", "SSH_AUTH_SOCK", "PWD",
                  "OLDPWD", "secret_env", "PASSWORD_FILE", "token", "key", "AWS_ACCESS_KEY_ID",
                  "GIT_ASKPASS", "XAUTHORITY", "HF_TOKEN_PATH", "tokenizer_path", "keyring",
                  "secret_files", "token_usage", "hotkey", "monkey", "max_prefill_tokens",
                  "cached_tokens", "kv_cache_dtype"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ORDINARY_NAMES)
def test_ordinary_names(name):
    assert not is_secret_name(name)


def test_the_environment_digest_uses_the_same_rule():
    from infer_forge.harness.tool_calls.calls import env_digest

    for name in SECRET_NAMES:
        if name.replace("_", "").isalnum():
            assert env_digest({name: "a1b2c3d4"}) == env_digest({name: "z9y8x7w6"}), name
    for name in ("TOKENIZERS_PARALLELISM", "max_new_tokens", "SSH_AUTH_SOCK", "PWD"):
        assert env_digest({name: "false"}) != env_digest({name: "true"}), name


V = "q7Wz-Lp3Xr9_Mn2B"  # a value under a secret name, in every form below

ASSIGNMENTS = [
    f"export MY_API_KEY={V}",
    f"MY_API_KEY={V} and more on the line",
    f"[2026-11-29 10:00:01] INFO MY_API_KEY: {V}",
    f"AWS_SECRET_ACCESS_KEY: {V}",
    f'{{"AWS_SECRET_ACCESS_KEY": "{V}", "region": "us-east-1"}}',
    f"env: {{'api_key': '{V}'}}",
    f"python serve.py --api-key {V} --port 30000",
    f"python serve.py --api-key={V} --port 30000",
    f"python serve.py --env AWS_SECRET_ACCESS_KEY={V}",
    f"ServerArgs(model_path='x', api_key='{V}', port=30000)",
    f"curl 'https://api.example.com/v1?access_token={V}&x=1'",
    f"Authorization: Basic {V}",
    f"db_password = {V}",
    f"PGPASSWORD={V} psql -h db",
    f"  client-secret: \"{V}\"",
    f"$config['auth_token'] => '{V}';",
    f'cmd = "env \\"MY_API_KEY\\": \\"{V}\\""',
    f"line one\\nGITHUB_PAT={V}\\nline three",
    f"password: 123456{V}",
]
ORDINARY = [
    "max_new_tokens: 128", "TOKENIZERS_PARALLELISM=false", "bos_token: <s>",
    "#new-token: 32768, #cached-token: 0, token usage: 0.00, #token: 1234",
    "api_key=None, port=30000", "--max-new-tokens 128", "PWD=/home/forge/work",
    "SSH_AUTH_SOCK=/tmp/ssh-XXXX/agent.42", "KEYBOARD=us", "sort_key: timestamp",
    "time_to_first_token: 0.21", "password_file: /etc/forge/pw", "secret_env: HF_TOKEN",
    "url: https://example.org:443/a", "max_tokens=512", "key: value", "token: hello",
    "MY_API_KEY=${MY_API_KEY}", "export HF_TOKEN=$HF_TOKEN", "api_key: ''",
    "--api-key --port 30000", "TOKEN_LIMIT=4096", "auth_mode: none",
]


@pytest.mark.parametrize("text", ASSIGNMENTS)
def test_values_under_secret_names_are_redacted_in_text(redactor, text):
    assert V in text
    short = redactor.text(text)
    assert V not in short and "[REDACTED:" in short
    for log in (text + "\n" + SGLANG_LOG * 8, SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG * 4):
        assert V not in redactor.text(log)
    doc = orjson.dumps({"cmd": text, "argv": ["sh", "-c", text]})
    assert redactor.might_contain_secret_bytes(doc) and V.encode() not in redactor.json_bytes(doc)
    assert V not in orjson.dumps(redactor.value({"notes": [text]})).decode()


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_assignments_stay_intact(redactor, text):
    assert redactor.text(text) is text
    assert not redactor.has_secret({"line": text, "lines": [text]})
    big = SGLANG_LOG * 4 + text + "\n" + SGLANG_LOG
    assert redactor.text(big) is big


def test_values_under_secret_keys_in_structured_data(redactor):
    aws = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"[::-1]  # not the AWS rule's shape alone
    data = {
        "config": {"env": {"AWS_SECRET_ACCESS_KEY": aws, "TOKENIZERS_PARALLELISM": "false"},
                   "max_new_tokens": 128, "db_password": 123456, "apiKey": V,
                   "secrets": [V, "second-" + V]},
        "argv": ["serve", "--api-key", V, "--port", "30000", "--hf-token", V + "x"],
        "env": [{"name": "MY_API_KEY", "value": V}, {"name": "PATH", "value": "/usr/bin"}],
        "diff": [{"path": "config.env.MY_API_KEY", "dimension": "config", "a": V, "b": V + "2"},
                 {"path": "config.max_new_tokens", "dimension": "config", "a": 64, "b": 128}],
    }
    assert redactor.has_secret(data)
    out = redactor.value(data)
    text = orjson.dumps(out).decode()
    assert V not in text and aws not in text and "123456" not in text
    assert out["config"]["env"]["TOKENIZERS_PARALLELISM"] == "false"
    assert out["config"]["max_new_tokens"] == 128
    assert out["argv"][:2] == ["serve", "--api-key"] and out["argv"][3:5] == ["--port", "30000"]
    assert out["env"][1] == {"name": "PATH", "value": "/usr/bin"}
    assert out["diff"][1] == data["diff"][1]
    assert redactor.json_bytes(orjson.dumps(data)) == orjson.dumps(out)
    ordinary = {"max_new_tokens": 128, "TOKENIZERS_PARALLELISM": "false", "bos_token": "<s>",
                "metrics": {"time_to_first_token": 0.21, "max_tokens": 512}, "key": "x",
                "token": "hello", "new_token": 32768, "api_key": None, "password_file": "/x",
                "argv": ["--max-new-tokens", "128", "--api-key", "--port"]}
    assert not redactor.has_secret(ordinary)
    assert redactor.value(ordinary) == ordinary
    assert redactor.json_bytes(orjson.dumps(ordinary)) == orjson.dumps(ordinary)


def test_the_triggers_catch_every_assignment_the_rule_redacts():
    """The screen is a necessary condition of every rule (module contract): for generated
    `NAME<sep>value` texts, whenever the rule redacts, the short-string screen, the JSON-bytes
    screen and the long-log path all find it."""
    rng = random.Random(7)
    r = Redactor()
    names = SECRET_NAMES + ORDINARY_NAMES + ["new-token", "Api_Key9", "SECRETÄ", "auth"]
    seps = ["=", ": ", " = ", ":", "=>", "\": \"", "': '", " ", "=\"", "\\\": \\\""]
    values = [V, "12345", "1e5", " spaced", "None", "0.5", "abc", "$REF", "-x", "9f8e7d6c",
              "a,b", "12,ab", "x'y", "<s>"]
    leads = ["", "export ", "  ", "[ts] ", "--", "\"", "{'", "x\\n"]
    checked = 0
    for _ in range(4000):
        text = (rng.choice(leads) + rng.choice(names) + rng.choice(seps) + rng.choice(values)
                + rng.choice(["", "\"", "'", " tail", ",next=1"]))
        direct = redact_assignments(text)
        if direct is text:
            continue
        checked += 1
        assert r.might_contain_secret(text), text
        assert r.might_contain_secret_bytes(orjson.dumps(text)), text
        assert r.text(text) == direct, text
        log = SGLANG_LOG * 5 + text + "\n"
        assert r.text(log) == SGLANG_LOG * 5 + direct + "\n", text
    assert checked > 500


def test_env_secret_values_skip_trivial_values():
    env = {"MY_API_KEY": "k3y-" + V, "DB_PASSWORD": "hunter22", "HF_TOKEN": "false",
           "GITHUB_TOKEN": "12345678", "SESSION_TOKEN": "abc", "AUTH": "CHANGEME",
           "TOKENIZERS_PARALLELISM": "parallel-on-9", "PATH": "/usr/bin:/bin"}
    assert sorted(env_secret_values(env)) == sorted(["k3y-" + V, "hunter22"])
    assert env_secret_values({"X_URL": "https://x"}, ["X_URL"]) == ["https://x"]
    base = Redactor()
    assert base.with_values([]) is base and base.for_env({"PATH": "/usr/bin"}) is base
    child = base.for_env(env)
    assert child.text("printed hunter22 here") == "printed [REDACTED:configured-secret] here"
    assert base.text("printed hunter22 here") == "printed hunter22 here"


GH = "ghp_" + "a1b2c3d4e5f6g7h8i9j0k1l2m3n4o5p6q7r8"


def test_a_stream_name_or_command_id_holding_a_secret_is_refused(workspace):
    from infer_forge.ledger.errors import LedgerError

    ev = E.TaskExited(task_id="t", state="aborted-by-human", reason="x")
    before = workspace.ledger.max_position()
    for kwargs, what in (({"stream": f"task:{GH}"}, "task id"),
                         ({"stream": f"graph:x-{GH}"}, "graph id"),
                         ({"stream": "task:t", "command_id": f"t:b1:run:{GH}"}, "command id"),
                         ({"stream": f"export HF_TOKEN={V}"}, "stream name")):
        stream = kwargs.pop("stream")
        with pytest.raises(LedgerError) as e:
            workspace.ledger.append(stream, [ev], **kwargs)
        assert str(e.value).startswith(f"{what} looks like a secret (")
        assert "refusing to record it" in str(e.value)
        assert GH not in str(e.value) and V not in str(e.value)
    assert "(GitHub Token)" in _refusal(workspace, f"task:{GH}")
    assert workspace.ledger.max_position() == before


def _refusal(ws, stream: str) -> str:
    from infer_forge.ledger.errors import LedgerError

    with pytest.raises(LedgerError) as e:
        ws.ledger.append(stream, [E.TaskExited(task_id="t", state="aborted-by-human",
                                               reason="x")])
    return str(e.value)


def test_a_redaction_the_event_schema_cannot_hold_is_refused(workspace):
    """A number under a secret name in a map of floats cannot become `[REDACTED…]` and still
    decode: the event is refused (naming the field, not the value), nothing is written."""
    from infer_forge.ledger.errors import LedgerError

    before = workspace.ledger.max_position()
    ev = E.MeasurementRecorded(task_id="t", block_id="b1", run_id="r1", source="s",
                               metrics={"output_throughput": 1.0, "db_password": 482913.0})
    with pytest.raises(LedgerError) as e:
        workspace.ledger.append("task:t", [ev])
    assert "metrics.db_password" in str(e.value) and "482913" not in str(e.value)
    assert workspace.ledger.max_position() == before
    ok = E.MeasurementRecorded(task_id="t", block_id="b1", run_id="r1", source="s",
                               metrics={"max_new_tokens": 128.0, "time_to_first_token": 0.2},
                               meta={"server_args": {"api_key": V}})
    workspace.ledger.append("task:t", [ok])
    (back,) = [r.event for r in workspace.ledger.stream("task:t")]
    assert back.metrics == ok.metrics and back.meta == {"server_args": {"api_key": NAMED}}
