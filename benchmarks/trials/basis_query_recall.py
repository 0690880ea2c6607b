"""CPU: LOCKS's recall with the basis term's query rounded to one int8 plane, as score_pages_gluon_heads rounds it
(score_pages.int8_query), against exact q, on real text (the tiny LM on one held-out document, 16 queries per layer).

    python benchmarks/trials/basis_query_recall.py CONTEXT OUT.json"""
import json, sys, torch
sys.path.insert(0, ".")
from benchmarks.tiny_lm.capture_kv import capture
from benchmarks.tiny_lm.corpus import default_roots, load_corpus
from benchmarks.tiny_lm.export import load_model
from sglang_locks import selectors as S
from sglang_locks.evaluate import evaluate
from sglang_locks.kernels.score_pages import int8_query

class Q8(S.LocksSelector):
    def __init__(self, rank=8, precision="int8-int4-int8"):
        super().__init__(rank, precision); self.name = "locks-q8"
    def head_scores(self, q, ranks=None):
        mu, basis, coef = self.summaries.dequantize()
        qg = S._by_head(q, self.summaries.num_kv_heads)
        qb = S._by_head(int8_query(q).float(), self.summaries.num_kv_heads)
        qmu = torch.einsum("mhgd,phd->mhgp", qg, mu)
        proj = torch.einsum("mhgd,phrd->mhgpr", qb, basis)
        local = torch.einsum("mhgpr,phir->mhgpi", proj, coef)
        return torch.logsumexp((qmu[..., None] + local) * self.sm_scale, -1).flatten(1, 2)

orig = S.make_selector
S.make_selector = lambda spec, rank=8, precision="int8-int4-int8": Q8(rank, precision) if spec == "locks-q8" else orig(spec, rank, precision)
import sglang_locks.evaluate as E
E.make_selector = S.make_selector
context = int(sys.argv[1])
torch.manual_seed(0)
model = load_model("benchmarks/models/tiny-llama-pycode", torch.device("cpu"), torch.float32)
doc = load_corpus(default_roots([])).held_out_documents(context + 1, 1)[0]
layers = capture(model, doc["ids"][None, :context], 16)
budgets = [64, 256, 512, 1024, 2048]
rec = {}
for li, layer in enumerate(layers):
    q = layer["queries"][0].float()
    print("layer", li, "q max/rms per head:", (q.abs().amax(-1) / q.pow(2).mean(-1).sqrt()).mean().item(), flush=True)
    for row in evaluate({"keys": layer["keys"][0].float(), "queries": q, "values": None}, budgets, ["oracle", "locks", "locks-q8"]):
        rec.setdefault((row["selector"], row["budget"]), []).append(row["recall"])
rows = [dict(selector=s, budget=b, recall=sum(v) / len(v), per_layer=v) for (s, b), v in rec.items()]
for r in rows: print(r)
json.dump(dict(command="python " + " ".join(sys.argv), context=context, document=f"{doc['package']}@{doc['offset']}",
               rows=rows), open(sys.argv[2], "w"), indent=1)
