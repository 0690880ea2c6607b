"""CPU experiment: prefilter estimate q.mu + log16 (+ a spread term from each page's per-rank max |coefficient|,
i.e. its stored coefficient scales) -> recall of the prefilter's selection vs LOCKS every page, tiny LM.
PYTHONPATH=. python benchmarks/trials/prefilter_spread_recall.py CONTEXT OUT.json   (CPU; the 64K run used the gammas below)"""
import json, sys, time
import torch
import sglang_locks.evaluate as ev
from sglang_locks.selectors import LocksPrefilterSelector, _by_head, make_selector
from benchmarks.tiny_lm.capture_kv import capture
from benchmarks.tiny_lm.corpus import default_roots, load_corpus
from benchmarks.tiny_lm.export import load_model


class Spread(LocksPrefilterSelector):
    def __init__(self, factor, form, gamma):
        super().__init__(factor, 0)
        self.form, self.gamma = form, gamma
        self.name = f"spread:{factor}:{form}:{gamma}"

    def head_scores(self, q):
        full = super().head_scores(q)          # sets self.estimates (q.mu + log 16)
        mu, basis, coef = self.summaries.dequantize()   # coef [P, H, 16, r]
        m2 = coef.abs().amax(2).pow(2).sum(-1)          # [P, H]: sum_r max_i c_ir^2
        qn = _by_head(q, self.summaries.num_kv_heads).norm(dim=-1)  # [M, H, G]
        if self.form == "bound":
            t = self.gamma * self.sm_scale * qn[..., None] * m2.sqrt().T[None, :, None, :]
        else:
            t = self.gamma * 0.5 * self.sm_scale ** 2 * (qn ** 2 / q.shape[-1])[..., None] * m2.T[None, :, None, :]
        self.estimates = self.estimates + t.flatten(1, 2)
        return full


specs = {}
def make(spec, rank=8, precision="int8-int4-int8"):
    return specs[spec]() if spec in specs else make_selector(spec, rank, precision)
ev.make_selector = make

ctx, out = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
model = load_model("benchmarks/models/tiny-llama-pycode", torch.device("cpu"), torch.float32)
doc = load_corpus(default_roots([])).held_out_documents(ctx + 1, 1)[0]
t0 = time.time()
layers = capture(model, doc["ids"][None, :ctx], 16)
print("captured", time.time() - t0, flush=True)
names = ["oracle", "locks", "locks-prefilter:8:0"]
for form, gammas in (("bound", (0.5, 1.0, 2.0, 4.0)), ("gauss", (1.0, 4.0, 16.0))):
    for g in gammas:
        n = f"spread:8:{form}:{g}"
        specs[n] = (lambda g=g, form=form: Spread(8, form, g))
        names.append(n)
rec = {}
for li, layer in enumerate(layers):
    data = {"keys": layer["keys"][0].float(), "queries": layer["queries"][0].float(), "values": None}
    for row in ev.evaluate(data, [512, 2048], names):
        rec.setdefault(f'{row["selector"]}@{row["budget"]}', []).append(row["recall"])
    print("layer", li, time.time() - t0, flush=True)
res = {k: sum(v) / len(v) for k, v in rec.items()}
for k, v in sorted(res.items()):
    print(k, round(v * 100, 2))
json.dump({"context": ctx, "recall": res}, open(out, "w"), indent=1)
