"""NSP / SOP: sentence pairs from a real blank_line token store (German books), the head and loss
against transformers' BertForPreTraining, and one short training run that resumes and exports."""
import json
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlm_jax.workdir import restore
from mlm_jax.config import defaults
from mlm_jax.data.store import shards
from mlm_jax.data.store import pairs
from mlm_jax.data.store import prepare
from mlm_jax.data.tokenizers import load as tokenizer_load
from mlm_jax.data.tokenizers import spm_training
from mlm_jax.errors import DataError

BOOKS = "corpus/de/gutenberg_kalamine/*.txt.gz"    # paragraphs separated by blank lines
ALICE = "corpus/de/gutenberg_kalamine/de_alice.txt.gz"


@pytest.fixture(scope="module")
def bert_store(shared_data, tmp_path_factory):
  root = tmp_path_factory.mktemp("pairs")
  # 4000 of the books' 22,000 lines train the 600 pieces (2 s, not 15 s); the store has every line.
  spm = spm_training.train([f"de={shared_data / BOOKS}"], str(root / "spm"), vocab_size=600, layout="bert",
                           verbose=False, input_sentence_size=4000)
  out = str(root / "store")
  prepare.prepare(prepare.Options(sources=(f"de={shared_data / BOOKS}",), tokenizer=spm.model_path,
                                  eval_percent=2.0, doc_format="blank_line"), out, progress_s=1e9, log=lambda s: None)
  return out


def _cfg(root, seq_len=64):
  c = defaults.data_defaults()
  c.sources, c.seq_len = (f"store:{root}",), seq_len
  return c


def _contiguous(doc_ids, part):
  """Whether `part` occurs as a contiguous run of the document's tokens."""
  n = len(part)
  return any(np.array_equal(doc_ids[i:i + n], part) for i in range(len(doc_ids) - n + 1))


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_pairs_balanced_skip_single_sentence_docs_and_resume(bert_store, task, tmp_path):
  c = _cfg(bert_store)
  pipe = pairs.PairPipeline(c, task, 1000, seed=5, cache_dir=str(tmp_path))
  labels = np.concatenate([next(pipe)["sentence_labels"] for _ in range(10)])
  stats = pipe.stats()
  assert stats["pairs"]["pairs"] == 10_000 and abs(labels.mean() - 0.5) <= 0.02, labels.mean()
  de = stats["sources"]["de"]   # the logged estimate (rows x mean pair length) against the tokens read
  assert abs(de["tokens"] / de["tokens_local"] - 1) < 0.05, de
  # one-sentence documents: skipped, and counted exactly
  st = shards.Store(bert_store)
  n = st.lengths("de", "train").size
  single = sum(pairs.sentences(d)[0].size < 2 for d in st.read("de", "train", np.arange(n)))
  assert single > 0 and stats["sources"]["de"]["single_sentence_docs_skipped"] == single
  assert stats["pairs"]["single_sentence_docs_skipped"] == single
  assert not np.isin(pipe.streams[0].index["chunk_doc"],
                     [i for i, k in enumerate(pipe.streams[0].index["doc_sentences"]) if k < 2]).any()
  # layout and order: [CLS] A [SEP] B [SEP]; in-order pairs are a contiguous stretch of one document
  small = pairs.PairPipeline(c, task, 16, seed=5, cache_dir=str(tmp_path))
  b = next(small)
  stream = small.streams[0]
  src, chunk = small._locate(np.arange(16, dtype=np.int64))
  checked = 0
  for r in range(16):
    ids, types = b["input_ids"][r], b["token_type_ids"][r]
    seps = np.nonzero(ids == small.eos_id)[0]
    assert ids[0] == small.bos_id and len(seps) == 2 and types[seps[0]] == 0 and types[seps[0] + 1] == 1
    a, bb = ids[1:seps[0]], ids[seps[0] + 1:seps[1]]
    assert (b["segment_ids"][r] > 0).sum() == seps[1] + 1 and (ids[seps[1] + 1:] == small.pad_id).all()
    if len(a) + len(bb) < stream.budget:   # not truncated: the pair is whole sentences of the document
      doc = st.read("de", "train", [stream.index["chunk_doc"][chunk[r]]])[0].ids
      first, second = (bb, a) if task == "sop" and b["sentence_labels"][r] else (a, bb)
      in_order = _contiguous(doc, np.concatenate([first, second]))
      assert in_order == (task == "sop" or b["sentence_labels"][r] == 0)
      checked += 1
  assert checked >= 2
  # resume: the data state is a row count; the same pairs come after set_state
  run = pairs.PairPipeline(c, task, 8, seed=5, cache_dir=str(tmp_path))
  for _ in range(3):
    next(run)
  state = run.get_state()
  want = [next(run) for _ in range(2)]
  again = pairs.PairPipeline(c, task, 8, seed=5, cache_dir=str(tmp_path))
  again.set_state(state)
  for w in want:
    got = next(again)
    for k in pairs.FEATURES:
      np.testing.assert_array_equal(got[k], w[k])


def test_xlmr_layout_and_errors(shared_data, corpus_and_tokenizer, tmp_path):
  tok = tokenizer_load.load(corpus_and_tokenizer[1])   # the session's xlmr-layout tokenizer
  root, lines = str(tmp_path / "xlmr"), str(tmp_path / "lines")
  for out, fmt in ((root, "blank_line"), (lines, "line")):
    prepare.prepare(prepare.Options(sources=(f"de={shared_data / ALICE}",), tokenizer=tok.model_path,
                                    eval_percent=0.0, doc_format=fmt), out, progress_s=1e9, log=lambda s: None)
  pipe = pairs.PairPipeline(_cfg(root, 48), "sop", 8, seed=0, cache_dir=str(tmp_path))
  b = next(pipe)
  for ids, types in zip(b["input_ids"], b["token_type_ids"]):
    eos = np.nonzero(ids == tok.eos_id)[0]   # <s> A </s></s> B </s>
    assert ids[0] == tok.bos_id and len(eos) == 3 and eos[1] == eos[0] + 1 and not types.any()
  with pytest.raises(DataError, match="none of its .* documents has two lines"):
    pairs.PairPipeline(_cfg(lines), "nsp", 8, seed=0, cache_dir=str(tmp_path))   # line format
  from mlm_jax.config.defaults import default_config
  from mlm_jax.errors import ConfigError
  from mlm_jax.objectives import registry
  from mlm_jax.training import resolve
  c = default_config()
  c.objective, c.data.sources = "mlm+nsp", ("de=corpus/*.txt",)
  with pytest.raises(ConfigError, match=r"objective='mlm\+nsp' needs token-store sources.*prepare_data.py"):
    resolve.check_input(c, registry.load(c.objective))


def _tiny_bert(torch, transformers):
  torch.manual_seed(0)
  cfg = transformers.BertConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=48, max_position_embeddings=40, type_vocab_size=2, pad_token_id=0)
  return cfg


def test_nsp_head_and_loss_match_bert_for_pretraining():
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from flax import nnx
  from mlm_jax.convert import bert
  from mlm_jax.config.defaults import default_config
  from mlm_jax.model.encoder import Encoder
  from mlm_jax.objectives.sentence import SentenceStep
  hcfg = _tiny_bert(torch, transformers)
  cfg = bert.model_config_from_hf(hcfg.to_dict(), default_config().model)
  cfg.update(use_pooler=True, sentence_head=True, hidden_dropout=0.0, attention_dropout=0.0)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Encoder(cfg, seed=3)), nnx.Param)
  # Norm scales near 1, everything else (biases too) near 0, drawn on the host: the jitted init compiles for
  # seconds, and its values are no part of the claim.
  rng = np.random.default_rng(1)
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: jnp.asarray(("scale" in jax.tree_util.keystr(path)) + 0.05 * rng.normal(size=x.shape), x.dtype),
      params)
  theirs = transformers.BertForPreTraining(hcfg).eval()
  sd = {k: torch.from_numpy(np.array(v)) for k, v in bert.params_to_hf(params, cfg, "bert").items()}
  missing, unexpected = theirs.load_state_dict(sd, strict=False)
  assert not unexpected and all("predictions.decoder" in k for k in missing), missing   # tied to ours

  rng = np.random.default_rng(0)
  b, s, p = 4, 16, 3
  ids = rng.integers(5, 101, (b, s))
  types = (np.arange(s)[None] >= rng.integers(4, 12, (b, 1))).astype(np.int64)
  positions = np.stack([rng.choice(np.arange(1, s), p, replace=False) for _ in range(b)])
  labels = rng.integers(5, 101, (b, p))
  sent = rng.integers(0, 2, b)
  mlm_labels = np.full((b, s), -100)
  np.put_along_axis(mlm_labels, positions, labels, 1)
  with torch.no_grad():
    out = theirs(input_ids=torch.from_numpy(ids), token_type_ids=torch.from_numpy(types),
                 labels=torch.from_numpy(mlm_labels), next_sentence_label=torch.from_numpy(sent))
  batch = dict(input_ids=ids, segment_ids=np.ones((b, s)), positions=np.broadcast_to(np.arange(s), (b, s)),
               token_type_ids=types, masked_positions=positions, masked_labels=labels,
               masked_weights=np.ones((b, p), np.float32), sentence_labels=sent)
  batch = {k: v.astype(np.float32 if k == "masked_weights" else np.int32) for k, v in batch.items()}
  objective = SentenceStep.__new__(SentenceStep)
  objective.z_loss = 0.0   # loss.z_loss off, the default

  @jax.jit
  def forward(params, batch):
    ours = nnx.merge(graphdef, params)
    hidden = ours(batch["input_ids"], batch["segment_ids"], batch["positions"], batch["token_type_ids"])
    return ours.sentence_logits(hidden), objective.loss_sums(ours, batch, None)

  logits, (total, sums) = forward(params, batch)
  np.testing.assert_allclose(np.asarray(logits), out.seq_relationship_logits.numpy(), atol=1e-4, rtol=1e-4)
  nsp = torch.nn.functional.cross_entropy(out.seq_relationship_logits, torch.from_numpy(sent)).item()
  assert float(sums["sentence_loss_sum"]) / b == pytest.approx(nsp, abs=1e-4)
  # BERT's pretraining loss: mean MLM + mean NSP, which our summed loss / predictions is
  assert float(total) / float(sums["num_predictions"]) == pytest.approx(out.loss.item(), abs=1e-4)


def _train(workdir, store_dir, steps=6):
  import subprocess
  from subproc import REPO, cpu_env
  cmd = [sys.executable, "-m", "mlm_jax.train", "--config=configs/demo.py", f"--workdir={workdir}",
         "--config.demo_corpus=False", f"--config.data.sources=('store:{store_dir}',)", "--config.objective=mlm+nsp",
         "--config.masking.mask_rate_schedule=('0:0.3','3:0.15')", "--config.data.seq_len=64",
         "--config.model.hidden_size=32", "--config.model.num_layers=1", "--config.model.num_heads=2",
         "--config.model.intermediate_size=64", "--config.model.max_position_embeddings=64",
         "--config.model.position_offset=0", "--config.model.type_vocab_size=2", "--config.model.layer_norm_eps=1e-12",
         "--config.train.batch_size=16", f"--config.train.steps={steps}", "--config.train.log_every=1",
         "--config.train.eval_every=1000", "--config.train.eval_batches=1", "--config.train.eval_at_start=False",
         "--config.train.save_every=3", "--config.train.peak_tflops_per_device=0.1", "--config.optimizer.warmup_steps=2"]
  return subprocess.run(cmd, cwd=REPO, env=cpu_env(1), capture_output=True, text=True, timeout=600)


def _lines(workdir):
  return {d["step"]: d for d in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "loss" in d}


def test_train_resume_after_kill_and_export_bert_for_pretraining(bert_store, tmp_path):
  """The real binary: pairs, head, schedule logged; a run continued from its step-3 checkpoint (as
  after kill -9) logs the same losses and mask rates; to_hf gives a BertForPreTraining whose NSP
  logits are ours (1e-4)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  full = tmp_path / "full"
  p = _train(full, bert_store)
  assert p.returncode == 0, p.stderr[-3000:]
  lines = _lines(full)
  assert [lines[s]["mask_rate"] for s in (1, 3, 4, 6)] == [0.3, 0.3, 0.15, 0.15]   # value of the step run
  assert all(0 <= lines[s]["sentence_accuracy"] <= 1 for s in lines) and lines[6]["data/pairs"] > 0
  assert "data/single_sentence_docs_skipped" in lines[6]
  evals = [json.loads(l) for l in (full / "metrics.jsonl").read_text().splitlines() if "eval_loss" in l]
  assert evals and "eval_sentence_accuracy" in evals[-1]

  resumed = tmp_path / "resumed"
  shutil.copytree(full / "checkpoints" / "3", resumed / "checkpoints" / "3")
  p = _train(resumed, bert_store)
  assert p.returncode == 0 and "resuming from step 3" in p.stderr, p.stderr[-3000:]
  again = _lines(resumed)
  for s in (4, 5, 6):
    for k in ("loss", "sentence_loss", "mask_rate"):
      assert abs(again[s][k] - lines[s][k]) <= 1e-5, (s, k, again[s][k], lines[s][k])

  from flax import nnx
  from mlm_jax.workdir import files as workdir_files
  from mlm_jax.convert import folders
  out = tmp_path / "hf"
  summary = folders.to_hf(str(full), str(out))
  assert summary["arch"] == "bert" and "note" not in summary
  assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
  theirs = transformers.BertForPreTraining.from_pretrained(str(out)).eval()
  cfg = workdir_files.read_config(str(full))
  graphdef, params, _ = restore.restore_model(str(full), cfg.model)
  b = next(pairs.PairPipeline(_cfg(bert_store), "nsp", 8, seed=1, split="eval",
                                       cache_dir=str(tmp_path / "idx")))
  mask = b["segment_ids"] > 0

  @jax.jit   # one compile, not one per op
  def sentence_logits(params, ids, segments, positions, types):
    ours = nnx.merge(graphdef, params)
    return ours.sentence_logits(ours(ids, segments, positions, types))

  logits = sentence_logits(params, b["input_ids"], b["segment_ids"], b["positions"], b["token_type_ids"])
  with torch.no_grad():
    ref = theirs(input_ids=torch.from_numpy(b["input_ids"]).long(), attention_mask=torch.from_numpy(mask).long(),
                 token_type_ids=torch.from_numpy(b["token_type_ids"]).long())
  np.testing.assert_allclose(np.asarray(logits), ref.seq_relationship_logits.numpy(), atol=1e-4)


def test_to_hf_of_an_xlmr_layout_model_drops_the_sentence_head(corpus_and_tokenizer, tmp_path):
  """No transformers class has XLM-R + a sentence head: the MLM model is written, and the note says so."""
  from mlm_jax.config.defaults import default_config
  from mlm_jax.convert import folders
  from mlm_jax.model import sharding
  from mlm_jax.objectives import registry
  from mlm_jax.training import trainer as trainer_lib
  from mlm_jax.workdir import checkpoints, files as workdir_files
  tok = tokenizer_load.load(corpus_and_tokenizer[1])
  c = default_config()
  c.objective = "mlm+sop"
  c.data.tokenizer, c.data.seq_len = tok.model_path, 16
  c.model.update(dict(vocab_size=tok.vocab_size, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                      max_position_embeddings=18, type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5))
  objective = registry.load(c.objective)
  objective.bind(c)
  trainer = trainer_lib.make_trainer(c, sharding.make_mesh(c.mesh), objective)
  # A train state of the trainer's shapes, random values made on the host (its jitted init compiles for seconds).
  rng = np.random.default_rng(0)
  state = jax.tree.map(lambda x: jax.device_put(rng.normal(size=x.shape).astype(x.dtype)), jax.eval_shape(trainer.init))
  ck = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ck.save(1, state, {})
  ck.wait()
  workdir_files.write_config(c, str(tmp_path))
  summary = folders.to_hf(str(tmp_path), str(tmp_path / "hf"))
  assert summary["arch"] == "xlm-roberta" and "sentence (NSP/SOP) head was dropped" in summary["note"]
  hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_cfg["architectures"] == ["XLMRobertaForMaskedLM"]
  from safetensors.numpy import load_file
  assert not [k for k in load_file(str(tmp_path / "hf" / "model.safetensors")) if "seq_relationship" in k]
