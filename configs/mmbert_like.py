"""mmBERT-style multilingual curriculum (Marone et al., 2025, "mmBERT: A Modern Multilingual Encoder with
Annealed Language Learning", arXiv:2509.06888) on the 14 languages of ../shared/data/corpus, as config fields:
mask rate 30% -> 15% -> 5%, language-sampling exponent 0.7 -> 0.5 -> 0.3, and languages added in three stages.

  # once: a tokenizer and one store with one source per language (run from ../shared/data)
  python tools/train_tokenizer.py --input='en=corpus/en/gutenberg_nltk/*.txt.gz' ... (the 14 SOURCES below) \
      --vocab_size=8000 --max_sentences_per_language=3000 --input_sentence_size=40000 --out=/tmp/mmbert_demo/spm
  python tools/prepare_data.py --sources='en=corpus/en/gutenberg_nltk/*.txt.gz' ... (the 14 SOURCES) \
      --tokenizer=/tmp/mmbert_demo/spm.model --out=/tmp/mmbert_demo/store --num_workers=2 --eval_percent=1
  python -m mlm_jax.train --config=configs/mmbert_like.py:demo --workdir=/tmp/mmbert_demo/run
  python -m mlm_jax.train --config=configs/mmbert_like.py:demo_phases --workdir=/tmp/mmbert_demo/phases   # as phases
  python -m mlm_jax.train --config=configs/mmbert_like.py --workdir=gs://BUCKET/mmbert_base   # full size
  # other store: --config=configs/mmbert_like.py:demo,store=/data/store/mmbert (or :phases,store=...: the
  # phases name the store too)

Hardware: `demo`: any 2-core CPU, 300 steps of 32 x 64 tokens, a 2-layer 64-wide encoder, a few minutes
(plus ~1 min for the tokenizer and ~1 min to prepare the store). Full size: a TPU v5p-128 slice or 64+ GPUs
(bf16, fsdp), weeks; the shared corpora are ~110 MB, so the full size is for your own corpora (same source
names, or edit STAGES).
Expected (demo): the held-out MLM loss (all 14 languages, 15% masking) falls from ln 8000 = 9.0 to
8.2 / 7.6 / 7.0 at steps 100 / 200 / 300; the logged per-language weights (`data/<lang>/weight`,
`data/mix_alpha`, `data/phase`) and mask rate (`mask_rate`) change at steps 100 and 200, and the
token shares measured from `data/<lang>/tokens` follow p_i ∝ n_i^alpha over the languages started so
far within 0.0003 (docs/objectives.md, "Curricula").
Recipe: mmBERT's three phases (pretraining, mid-training, decay) run as one job, with its mask rates and
inverse-temperature exponents; its 60 -> 110 -> 1833 languages become 8 -> 11 -> 14 here (largest
first: en de fr es it ru zh ja, then uk el vi, then bn hy mr). mmBERT's encoder is ModernBERT; this file
keeps the post-LN XLM-R layout so that the result converts to transformers' XLMRobertaForMaskedLM.
`:phases` / `:demo_phases` run the same three phases as config.phases (docs/phases.md): each its own
mask rate, alpha and languages (its data.sources name the store's sources it trains on,
`store:DIR:en,de,...`), a constant learning rate after the warmup and a linear decay to 0 in the last
(mmBERT's decay phase);
merge its checkpoints with tools/merge_checkpoints.py. Measured (`:demo_phases`): docs/phases.md.
Differences: in `:demo` / `:base` one learning-rate schedule spans the phases (mmBERT re-warms and
decays per phase).
"""
from mlm_jax.config.defaults import default_config

# name -> spec, relative to ../shared/data (the store names its sources by these names).
SOURCES = (
    "en=corpus/en/gutenberg_nltk/*.txt.gz", "de=tsv:1:corpus/de/leipzig/*.txt.gz",
    "fr=tsv:1:corpus/fr/leipzig/*.txt.gz", "es=tsv:1:corpus/es/leipzig/*.txt.gz",
    "it=tsv:1:corpus/it/leipzig/*.txt.gz", "ru=tsv:2:corpus/ru/tatoeba_cc0_rus.tsv.gz",
    "zh=corpus/zh/hongloumeng.txt.gz", "ja=corpus/ja/jawiki_truncated_clean.txt.gz",
    "uk=corpus/uk/ukwiki_truncated_clean.txt.gz", "el=corpus/el/elwiki_truncated_clean.txt.gz",
    "vi=corpus/vi/viwiki_truncated_clean.txt.gz", "bn=corpus/bn/bnwiki_truncated_clean.txt.gz",
    "hy=corpus/hy/hywiki_truncated_clean.txt.gz", "mr=corpus/mr/mrwiki_truncated_clean.txt.gz",
)
# Languages that join at the start of phase 2 and phase 3 (the rest train from step 0).
STAGES = (("uk", "el", "vi"), ("bn", "hy", "mr"))
MASK_RATES = (0.30, 0.15, 0.05)
ALPHAS = (0.7, 0.5, 0.3)


def get_config(size="base"):
  size, _, store = (size or "base").partition(",store=")   # `:demo_phases,store=DIR`: another store
  phased = size.endswith("phases")   # `phases` (full size) or `demo_phases`: the same recipe as config.phases
  size = {"phases": "base", "demo_phases": "demo"}.get(size, size)
  demo = size == "demo"
  c = default_config()
  steps = 300 if demo else 1_000_000
  # phase starts: mmBERT spends ~77% of its tokens in pretraining, ~20% mid-training, ~3% decay;
  # the demo splits evenly so that each phase is visible in a few hundred steps.
  starts = (0, 100, 200) if demo else (0, 770_000, 970_000)
  c.masking.mask_rate = MASK_RATES[1]      # the rate of evaluations (comparable across phases)
  c.masking.mask_rate_schedule = tuple(f"{s}:{r}" for s, r in zip(starts, MASK_RATES))
  c.data.mix_alpha = ALPHAS[0]
  c.data.mix_alpha_schedule = tuple(f"{s}:{a}" for s, a in zip(starts, ALPHAS))
  c.data.source_start_steps = tuple(f"{lang}={s}" for stage, s in zip(STAGES, starts[1:]) for lang in stage)
  store = store or ("/tmp/mmbert_demo/store" if demo else "/data/store/mmbert")
  c.data.sources = (f"store:{store}",)
  c.data.packing = "concat"
  c.tokenizer.layout = "xlmr"
  if demo:
    c.data.seq_len = 64
    c.model.update(dict(vocab_size=0, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256,
                        max_position_embeddings=66, type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5,
                        hidden_dropout=0.0, attention_dropout=0.0))
    c.optimizer.update(dict(learning_rate=2e-3, warmup_steps=30, schedule="linear", b2=0.98, weight_decay=0.01))
    c.train.update(dict(steps=steps, batch_size=32, log_every=10, eval_every=100, eval_batches=120,
                        eval_at_start=True, save_every=100))
  else:
    from mlm_jax.config import sizes as presets
    c.data.seq_len = 1024
    c.model.update(presets.size(size))
    c.model.update(dict(vocab_size=0, max_position_embeddings=1026, type_vocab_size=1, position_offset=2,
                        layer_norm_eps=1e-5, hidden_dropout=0.1, attention_dropout=0.1, dtype="bfloat16"))
    c.optimizer.update(dict(learning_rate=8e-4, warmup_steps=10_000, schedule="linear", b2=0.98, eps=1e-6,
                            weight_decay=0.01))
    c.train.update(dict(steps=steps, batch_size=4608, log_every=100, eval_every=10_000, save_every=5_000))
    c.mesh.update(dict(data=1, fsdp=-1, tensor=1))
  if phased:
    _phases(c, starts, steps)
  return c


def stage_languages() -> list[list[str]]:
  """The languages each phase trains on: those started so far (largest first, then STAGES)."""
  later = [lang for stage in STAGES for lang in stage]
  first = [spec.split("=")[0] for spec in SOURCES if spec.split("=")[0] not in later]
  return [first, first + list(STAGES[0]), first + list(STAGES[0]) + list(STAGES[1])]


def _phases(c, starts, steps):
  """The three phases as config.phases: each its own mask rate, alpha and languages (its data.sources:
  the store's sources of the languages started so far, `store:DIR:en,de,...`), the last one decaying
  the learning rate linearly to 0 (mmBERT's decay phase) from the rate the first two hold after the
  warmup (warmup-stable-decay: the decay starts where the stable rate is, with no jump). Each phase
  evaluates on its own languages' held-out rows at its own mask rate (not at 15% on all 14, as `:demo`
  does)."""
  c.masking.mask_rate_schedule, c.data.mix_alpha_schedule, c.data.source_start_steps = (), (), ()
  c.optimizer.schedule = "constant"
  store = c.data.sources[0]
  ends = (*starts[1:], steps)
  c.phases = tuple(
      {"name": name, "end_step": end, "masking.mask_rate": rate, "data.mix_alpha": alpha,
       "data.sources": (f"{store}:{','.join(langs)}",),
       **({"optimizer.schedule": "linear", "optimizer.warmup_steps": 0} if name == "decay" else {})}
      for name, end, rate, alpha, langs in zip(("pretrain", "mid", "decay"), ends, MASK_RATES, ALPHAS,
                                               stage_languages()))
  c.data.sources = c.phases[0]["data.sources"]
