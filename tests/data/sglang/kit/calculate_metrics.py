"""Run under the kit (harness/engines/sglang_import.py): SGLang's own bench metrics of the
cases in argv[1] (a JSON file: a list of {"records": [...], "duration": s, "slo": {...} |
null}), printed as a JSON list, one result per case. Uses the release's `calculate_metrics`
(sglang.benchmark.serving from 0.5.21, sglang.bench_serving before) and, where the release
has it, `calculate_goodput`."""

import dataclasses
import importlib
import json
import sys

try:
    serving = importlib.import_module("sglang.benchmark.serving")
except ImportError:
    serving = importlib.import_module("sglang.bench_serving")
DatasetRow = getattr(serving, "DatasetRow", None)


class Tokenizer:  # retokenization only feeds *_retokenized keys, which are not compared
    def encode(self, text, add_special_tokens=False):
        return text.split()




def one(data):
    outputs, rows = [], []
    for r in data["records"]:
        out = serving.RequestFuncOutput()
        out.success, out.error = r["success"], r["error"]
        out.latency, out.ttft, out.itl = r["e2e"], r["ttft"], list(r["itl"])
        out.prompt_len, out.output_len = r["prompt_len"], r["output_len"]
        out.generated_text = r["generated_text"]
        out.start_time = r["start_time"]
        outputs.append(out)
        rows.append(DatasetRow(prompt="p", prompt_len=r["prompt_len"], output_len=r["output_len"])
                    if DatasetRow is not None else ("p", r["prompt_len"], r["output_len"]))
    metrics, _ = serving.calculate_metrics(input_requests=rows, outputs=outputs,
                                           dur_s=data["duration"], tokenizer=Tokenizer(),
                                           backend="sglang-oai")
    if dataclasses.is_dataclass(metrics):
        result = {k: float(v) if isinstance(v, (int, float)) or hasattr(v, "__float__") else v
                  for k, v in dataclasses.asdict(metrics).items()}
    else:  # a msgspec Struct
        result = {k: float(getattr(metrics, k)) for k in metrics.__struct_fields__}
    if data.get("slo"):
        goodput = importlib.import_module("sglang.benchmark.goodput")
        g = goodput.calculate_goodput(outputs=outputs, goodput_slos=data["slo"],
                                      dur_s=data["duration"])
        result.update({k: getattr(g, k) for k in g.__struct_fields__})
    return result


print(json.dumps([one(case) for case in json.load(open(sys.argv[1]))]))
