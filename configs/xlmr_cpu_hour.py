"""A multilingual XLM-R-style masked LM (English, German, French, Russian) in under an hour of a 2-core CPU.

  python -m mlm_jax.train --config=configs/xlmr_cpu_hour.py --workdir=/tmp/xlmr_hour
  python -m mlm_jax.downstream --init_from=/tmp/xlmr_hour --fast --tasks=clams,blimp --baseline
  python -m mlm_jax.downstream --init_from=/tmp/xlmr_hour --fast --tasks=pos,uner,xquad --baseline \
      --pretrain_languages=en,de,fr,ru      # fine-tuned on English, scored zero-shot in the others

Data ($MLM_JAX_DATA/corpus, ../shared/data by default), one source per language, as the corpora come:
English books (Gutenberg: NLTK's selection and five more, Botchan, Tiny Shakespeare; 2.32M words),
French books (Gutenberg: Don Quixote, Monte Cristo, Faust, Alice; 0.90M), German Leipzig sentences
(web, news, Wikipedia; 0.37M) and Russian Tatoeba sentences (0.17M): 14 : 5.4 : 2.2 : 1, the kind of
imbalance language sampling is for. Languages are drawn with p_i ∝ n_i^alpha over their word counts
(`data.source_sizes`), alpha = 0.3 as in XLM-R (Conneau et al., 2020): en 36%, fr 27%, de 21%, ru 16%
of the rows (proportional, alpha 1: 66 / 26 / 11 / 5%). A 16000-piece unigram tokenizer is trained on
the same four sources, sampled with alpha 0.3 (WORKDIR/tokenizer, ~2 min).
Model: the XLM-R layout at 4 layers x 192 (3 heads, FFN 768, no dropout; en_cpu_hour.py's encoder),
128-token rows packed with segment ids, dynamic masking at 15%, AdamW (lr 1e-3, 5% warmup, linear decay to
0), bfloat16 matmuls with float32 weights (model.matmul; `:f32` for a CPU without AVX512-BF16 or AMX, where
bfloat16 is slower and the run's first lines warn so),
9000 steps of 32 x 128 = 36.9M tokens; CLAMS (64 pairs a language) and BLiMP (10 pairs a paradigm)
probed every 1500 steps, the held-out loss of each language every 1000.
Hardware: 2 CPU cores, no accelerator. Time: 35m54s on the idle 2-core VM (AVX512-BF16), 18-19.5k tokens/s,
peak RSS 4.1 GB.
Result (seed 0, 2026-12-04): held-out MLM loss en 3.70, fr 3.33, de 4.74, ru 3.98; CLAMS (300 pairs a file)
en 45.4, de 56.9, fr 59.6, ru 52.4 against random init's 51.7, 48.6, 49.7, 49.9 (one standard error ~1.1;
English 0.6; English's mean holds 4 NPI files that training inverts: on the 7 files every language has,
en 51.4 against 49.4); BLiMP --fast 50.8 (random init 44.4); POS fine-tuned on English, zero-shot accuracy de 40.6,
fr 42.3, ru 31.7 (random init 27.0, 23.2, 21.4). docs/quality.md#a-multilingual-recipe-xlmr_cpu_hourpy has
the tables, the monolingual runs, the sampling exponent's comparison and the tokenizer per language.

Variants (combine with commas): `:short` a quarter of the steps (the shortened rung of the comparisons);
`:hour` 14400 steps, the whole hour of the Zen 5 VM at the 9000 steps' pace (1h16m48s on a slower Intel VM,
13.6k tokens/s; seed 0: held-out en 3.36, fr 2.75, de 4.15, ru 3.25; CLAMS en 49.5, de 54.7, fr 57.6, ru 53.5
against its random init's 44.5, 50.4, 49.9, 50.3: every language above it, English included);
`:alpha=A` another sampling exponent (0.7: mmBERT's first phase, the same mean held-out loss as 0.3, better for
en/fr and worse for de/ru; 1.0: proportional, worse on the mean and the small languages); `:mono=LANG` one
language alone, for the steps that language gets in the multilingual run (its share of the rows at the
run's alpha: the monolingual baseline at equal per-language tokens; pass the multilingual run's
tokenizer with --config.data.tokenizer=WORKDIR/tokenizer/spm.model to keep the architecture);
`:f32` float32 matmuls.
"""
import os

from mlm_jax.config.defaults import default_config
from mlm_jax.data import specs

_DATA = os.environ.get("MLM_JAX_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                    "shared", "data"))
_C = os.path.normpath(os.path.join(_DATA, "corpus"))
# language -> (source spec, whitespace-separated words in it: the n_i of the sampling weights)
LANGUAGES = {
    "en": (",".join(os.path.join(_C, "en", g) for g in ("gutenberg_nltk/*.txt.gz", "gutenberg_kalamine/*.txt.gz",
                                                       "botchan.txt.gz", "tinyshakespeare.txt.gz")), 2_321_374),
    "fr": (os.path.join(_C, "fr", "gutenberg_kalamine", "*.txt.gz"), 904_780),
    "de": ("tsv:1:" + os.path.join(_C, "de", "leipzig", "*.txt.gz"), 373_134),
    "ru": ("tsv:2:" + os.path.join(_C, "ru", "tatoeba_cc0_rus.tsv.gz"), 166_947),
}
STEPS = 9000
HOUR_STEPS = 14400   # :hour, the whole hour of the Zen 5 VM at 9000 steps' measured pace (35m54s)
ALPHA = 0.3


def _variant(variant: str) -> dict:
  """'short,alpha=0.7' -> {'short': True, 'alpha': '0.7'}; unknown parts are a one-line error."""
  out = {}
  for part in (p for p in variant.split(",") if p):
    key, eq, value = part.partition("=")
    if (key in ("short", "hour", "f32") and not eq) or (key in ("alpha", "mono") and value):
      out[key] = value if eq else True
    else:
      raise ValueError(f"configs/xlmr_cpu_hour.py:{variant}: expected any of short, hour, f32, alpha=A, "
                       f"mono=LANG ({', '.join(LANGUAGES)}) joined by commas; got {part!r}")
  if "short" in out and "hour" in out:
    raise ValueError(f"configs/xlmr_cpu_hour.py:{variant}: short and hour are two budgets; pick one")
  if "mono" in out and out["mono"] not in LANGUAGES:
    raise ValueError(f"configs/xlmr_cpu_hour.py:{variant}: mono={out['mono']}: expected one of {list(LANGUAGES)}")
  return out


def language_shares(alpha: float) -> dict:
  """Each language's expected share of the training rows at `alpha` (what `data.mix_alpha` draws)."""
  weights = specs.mixing_weights([n for _, n in LANGUAGES.values()], alpha)
  return dict(zip(LANGUAGES, weights))


def get_config(variant=""):
  v = _variant(variant)
  try:
    alpha = float(v.get("alpha", ALPHA))
  except ValueError:
    raise ValueError(f"configs/xlmr_cpu_hour.py:{variant}: alpha must be a number") from None
  steps = STEPS // 4 if "short" in v else HOUR_STEPS if "hour" in v else STEPS
  languages = [v["mono"]] if "mono" in v else list(LANGUAGES)
  if "mono" in v:   # the rows this language gets in the multilingual run of the same length and alpha
    steps = round(steps * language_shares(alpha)[v["mono"]])

  c = default_config()
  c.seed = 0
  c.tokenizer.update(dict(vocab_size=16000, layout="xlmr", alpha=ALPHA))
  c.data.sources = tuple(f"{lang}={LANGUAGES[lang][0]}" for lang in languages)
  c.data.source_sizes = tuple(f"{lang}={LANGUAGES[lang][1]}" for lang in languages)
  c.data.mix_alpha = alpha
  c.data.doc_format = "blank_line"   # books in paragraphs; the sentence files are cut into ~32k-character blocks
  c.data.eval_percent = 5.0          # of the blocks: Russian's 1 MB is ~31 of them
  c.data.seq_len = 128
  c.data.shuffle_buffer = 10000
  c.model.update(dict(vocab_size=0, hidden_size=192, num_layers=4, num_heads=3, intermediate_size=768,
                      max_position_embeddings=130, type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5,
                      hidden_dropout=0.0, attention_dropout=0.0,
                      dtype="float32" if "f32" in v else "bfloat16"))
  c.masking.mask_rate = 0.15
  c.optimizer.update(dict(learning_rate=1e-3, warmup_steps=max(1, steps // 20), schedule="linear", b2=0.98,
                          eps=1e-6, weight_decay=0.01))
  c.train.update(dict(steps=steps, batch_size=32, log_every=100, eval_every=1000, eval_batches=4,
                      eval_at_start=False, save_every=1000, keep_checkpoints=2,
                      probe_every=1500, probe_tasks=("clams", "blimp"), probe_clams_pairs=64,
                      probe_clams_languages=tuple(LANGUAGES), probe_blimp_pairs=10))
  return c
