"""The full pretraining config schema with defaults, one function per section.

Every file in configs/ starts from `default_config()` and fine-tuning (finetune_defaults.py) reuses its
sections; the ConfigDict is locked, so an unknown key (`--config.trian.steps=5`) fails at start.
"""
import ml_collections

# data.packing_fit's default; a run whose config holds only it resumes on the fit its checkpoint names
PACKING_FIT = "best"


def loop_defaults() -> ml_collections.ConfigDict:
  """The `train` section: what the one loop (mlm_jax/training/loop.py) reads, for pretraining and fine-tuning."""
  t = ml_collections.ConfigDict()
  t.steps = 1000                 # with config.phases: the last phase's end (set from the phases)
  # > 0: stop after this step (saved, as at the end), leaving the schedule as train.steps (or the phases)
  # make it: train a stable phase once, then branch decays from its checkpoints (docs/phases.md).
  t.stop_at_step = 0
  t.batch_size = 32              # global, in sequences
  # > 0: the run's wall time (all its runs as goodput.json counts them: start-up and tokenizer, compiles,
  # evaluations, probes, saves; not the time between runs) ends within this many minutes. The loop times
  # budget_calibration_steps steps after the compile, one evaluation and one probe, then fixes train.steps
  # (train.steps is then the most it may be) in WORKDIR/time_budget.json: the decay ends at the last step, a
  # resume trains the same steps. Inside the warmup; pretraining without phases (training/time_budget.py).
  t.time_budget_minutes = 0.0
  t.budget_calibration_steps = 100
  # With a budget: when the machine's speed drifts so that the end misses the budget by more than 3% of it, plan
  # the steps again at a log line after the warmup (the rest of the schedule stretched over them; recorded, so a
  # resume repeats it). False: the first decision holds (the run is a plain run of its steps).
  t.budget_replan = True
  # Cadences in steps; 0 = never, except at the last step (a run always logs, evaluates and saves it).
  t.log_every = 50
  t.eval_every = 500
  t.eval_batches = 20            # pretraining: held-out global batches per evaluation
  t.eval_at_start = False        # also evaluate (and probe) the untrained model before the first step
  # Pretraining with 2+ sources in the eval split (data.eval_sources, else data.sources with eval_percent, or a
  # token store's sources): eval_batches of each source alone, logged as eval_loss/NAME, eval_accuracy/NAME, and
  # the totals pooled over them (False: eval_batches of the whole split, whose first batches are the first source's).
  t.eval_per_source = True
  # Pretraining: linear probes of the frozen encoder every probe_every steps (0 = off; mlm_jax/evaluation/probe.py),
  # on samples of these downstream suite tasks (sentence or token classification; ../shared/data), and
  # "blimp": zero-shot BLiMP accuracy by PLL on the first probe_blimp_pairs pairs of each of its 67 paradigms;
  # "clams": zero-shot CLAMS accuracy per language (probe/clams/LANG, their mean probe/clams) on a fixed sample
  # of probe_clams_pairs pairs a language, spread evenly over its files, of probe_clams_languages (() = all 5).
  t.probe_every = 0
  t.probe_tasks = ("sms_spam", "polarity", "pos")
  t.probe_train_examples = 384
  t.probe_eval_examples = 256
  t.probe_blimp_pairs = 10
  t.probe_clams_pairs = 64
  t.probe_clams_languages = ()
  t.save_every = 500
  # > 0: keep an exponential moving average of the parameters with this decay per step (in the train
  # state, sharded like them, checkpointed); held-out metrics are also reported for it (eval_ema_*),
  # and `convert_checkpoint.py to_hf --ema` exports it. 0 = off.
  t.ema_decay = 0.0
  t.keep_checkpoints = 3
  t.nonfinite = "skip"           # skip: drop the update and count it | stop: exit with an error
  t.max_consecutive_nonfinite = 20   # skip mode gives up after this many non-finite steps in a row
  t.peak_tflops_per_device = 0.0 # for MFU; 0 = known accelerator peak, or measured on CPU
  # After SIGTERM the loop saves at the next step boundary; a run that has not reached it this many
  # seconds later (stuck reading input) exits without saving. Preemption notices give ~30 s.
  t.sigterm_timeout_s = 25.0
  # WORKDIR/lock.json keeps a second run out (mlm_jax/workdir/lock.py); a lock whose process is gone
  # from this host, or older than this many hours, is taken over with a warning (0 = never by age).
  t.lock_stale_hours = 72.0
  # A newest checkpoint that cannot be restored: 'fallback' warns and restores the newest one that
  # can (the unreadable one stays on disk, skipped); 'refuse' stops with one line.
  t.on_corrupt_checkpoint = "fallback"
  # (first step, count): a jax.profiler trace of those steps into WORKDIR/tensorboard/plugins/profile
  # (mlm_jax/training/profiling.py; tools/profile_summary.py); () = off. A process's first step compiles
  # and is never traced: a window that includes it, or first = 0, starts at the next step.
  t.profile_steps = ()
  t.profile_all_hosts = False    # False: process 0 traces; True: every host writes its own trace
  return t


def tokenizer_defaults() -> ml_collections.ConfigDict:
  """Tokenizer training, used when data.tokenizer is '' (trained once into WORKDIR/tokenizer)."""
  tk = ml_collections.ConfigDict()
  tk.vocab_size = 8000
  tk.model_type = "unigram"      # unigram | bpe
  tk.layout = "xlmr"             # xlmr (<s>=0 <pad>=1 </s>=2 <unk>=3 ... <mask>=last) | bert
  tk.alpha = 0.3                 # language sampling exponent
  tk.input_sentence_size = 2_000_000
  return tk


def model_defaults() -> ml_collections.ConfigDict:
  """The encoder (mlm_jax/model/encoder.py, attention.py)."""
  m = ml_collections.ConfigDict()
  m.vocab_size = 0               # 0 = the tokenizer's size; otherwise must equal it
  m.hidden_size = 256
  m.embedding_size = 0           # 0 = hidden_size; ELECTRA: smaller, projected up (embeddings_project)
  m.num_layers = 4
  m.num_heads = 4
  m.intermediate_size = 1024
  m.max_position_embeddings = 512
  m.type_vocab_size = 2          # 0 = no token-type embeddings (RoBERTa uses 1, XLM-R 1)
  m.position_offset = 0          # RoBERTa / XLM-R: padding_idx + 1 = 2
  m.positions = "learned"        # learned | rotary
  m.norm = "post"                # post (BERT) | pre (modern recipes)
  m.mlp = "gelu"                 # gelu (exact erf GELU) | geglu
  m.layer_norm_eps = 1e-12       # BERT 1e-12, RoBERTa/XLM-R 1e-5
  m.hidden_dropout = 0.1
  m.attention_dropout = 0.1
  m.use_pooler = False
  # Structure switches (mlm_jax/model/encoder.py); ModernBERT: embedding_norm on, the four biases off,
  # first_layer_attention_norm off (configs/modernbert_base.py).
  m.embedding_norm = True        # LayerNorm on the embeddings (pre-LN adds its own after the last layer)
  m.attention_bias = True        # biases of the q / k / v / output projections
  m.mlp_bias = True              # biases of the FFN projections
  m.norm_bias = True             # LayerNorm biases (every norm of the model)
  m.head_bias = True             # the MLM head's dense bias (the decoder bias is always there)
  m.first_layer_attention_norm = True   # pre-LN: False = layer 0 attends to its input unnormalized
  # LTG-BERT / ELC-BERT switches (docs/model.md; to_hf refuses them: transformers has no such layers).
  m.extra_norms = False          # LayerNorms on the heads' output (before o) and on the FFN's hidden activation
  m.layer_weighting = False      # ELC-BERT: each layer reads a learned weighted sum of all earlier outputs
  # A binary sentence head (NSP / SOP) on the pooler: set by config.objective='mlm+nsp' | 'mlm+sop'.
  m.sentence_head = False
  m.mlm_head = True              # False: no MLM head parameters (ELECTRA's discriminator, fine-tuned from it)
  m.rope_theta = 10000.0
  m.initializer_range = 0.02
  m.dtype = "float32"            # compute dtype; bfloat16 on accelerators
  m.param_dtype = "float32"
  # auto = per the mesh's platform: splash on TPU, cudnn on GPU for padding-only batches,
  # else xla; attention dropout > 0 always takes xla (mlm_jax/model/attention.py: resolve_impl).
  m.attention_impl = "auto"      # auto | xla | splash | cudnn
  # auto = f32_out on CPU when dtype is below float32, else xla. f32_out: every matmul (forward and
  # backward) takes dtype operands and returns float32, XLA:CPU's fast bfloat16 path (mlm_jax/model/matmul.py).
  m.matmul = "auto"              # auto | xla | f32_out
  m.global_attention_every = 0   # 0 = every layer global; N = layer i global when i % N == 0, else local
  m.local_window = 128           # local layers: token i sees j when |i - j| <= local_window / 2 (HF ModernBERT)
  m.rope_theta_local = 10000.0   # rotary theta of the local layers
  m.scan_layers = False          # stack the layers (groups of global_attention_every) and lax.scan them
  m.remat = "none"               # none | full | dots
  return m


def masking_defaults() -> ml_collections.ConfigDict:
  """Dynamic masking inside the step (mlm_jax/objectives/masking.py)."""
  k = ml_collections.ConfigDict()
  # token | whole_word | span (SpanBERT: geometric lengths) | span_uniform (GPT-BERT / LTG-BERT: the row cut
  # into spans of 1..span_max tokens, whole spans chosen at random, 80/10/10 decided per span)
  k.mode = "token"
  k.mask_rate = 0.15
  k.mask_token_prob = 0.8
  k.random_token_prob = 0.1
  k.max_predictions = 0          # 0 = ceil(max mask rate * seq_len), rounded up per platform
  # Curriculum (mlm_jax/config/curricula.py): ('0:0.3', '2000:0.15', '4000:0.05') = the rate from each
  # step on; replaces mask_rate when set. constant: piecewise constant | linear: lines between points.
  k.mask_rate_schedule = ()
  k.mask_rate_schedule_mode = "constant"
  k.span_p = 0.2                 # SpanBERT geometric parameter
  k.span_max = 10                # span: the longest span; span_uniform: spans of 1..span_max (GPT-BERT: 3)
  # The mask id and the ids never selected or sampled are the tokenizer's: resolution derives them
  # (masking.mask_id, masking.special_ids in the resolved config; config/derived.py).
  return k


def optimizer_defaults() -> ml_collections.ConfigDict:
  """AdamW (or LAMB) and its schedule (mlm_jax/training/optim.py)."""
  o = ml_collections.ConfigDict()
  # adamw | lamb: Adam's direction plus weight decay, each weight matrix's update then scaled to
  # ||w|| / ||update|| (You et al., 2020; biases and norms take the plain step, as in BERT's and GPT-BERT's LAMB)
  o.name = "adamw"
  o.learning_rate = 1e-4         # peak
  o.warmup_steps = 100
  o.schedule = "linear"          # linear | cosine | constant | wsd (after warmup)
  o.end_lr_ratio = 0.0
  o.decay_fraction = 0.1         # wsd: the last fraction of train.steps decays (before it: the peak)
  o.decay_shape = "1-sqrt"       # wsd: linear | cosine | 1-sqrt
  # In tokens, as papers give them (> 0 replaces warmup_steps / decay_fraction; counted over the
  # phases' own batch sizes and sequence lengths): e.g. ModernBERT's 3B-token warmup.
  o.warmup_tokens = 0
  o.decay_tokens = 0             # wsd: the last this many tokens of the run decay
  o.b1 = 0.9
  o.b2 = 0.999
  o.eps = 1e-6
  o.weight_decay = 0.01
  o.clip_norm = 1.0              # 0 = off
  # > 0: each tensor's Adam update clipped to this RMS (1.0: the nearest optax equivalent of
  # StableAdamW, mlm_jax/training/optim.py); 0 = off.
  o.update_clip_rms = 0.0
  # False: Adam's moments are used without the 1 / (1 - b^t) correction, as in BERT's and ELECTRA's
  # reference AdamWeightDecayOptimizer: update t is then (1 - b1^t) / sqrt(1 - b2^t) times the corrected one,
  # larger early on with b2 near 1 (3.2x at step 1 with b1=0.9, b2=0.999).
  o.bias_correction = True
  o.grad_accum_steps = 1
  return o


def electra_defaults() -> ml_collections.ConfigDict:
  """The generator of `objective='electra'` (mlm_jax/objectives/electra.py); the discriminator is `config.model`."""
  e = ml_collections.ConfigDict()
  e.generator_hidden_size = 0      # 0 = model.hidden_size // 4 (the paper's best generator size)
  e.generator_num_heads = 0        # 0 = model.num_heads // 4 (at least 1)
  e.generator_intermediate_size = 0  # 0 = model.intermediate_size // 4
  e.generator_num_layers = 0       # 0 = model.num_layers
  e.disc_weight = 50.0             # lambda: loss = generator MLM + disc_weight x discriminator BCE
  # One embedding LayerNorm for both towers, as google-research/electra shares it with the tables;
  # False: one each (runs written before this field existed read as False and load unchanged).
  e.share_embedding_norm = True
  return e


def gpt_bert_defaults() -> ml_collections.ConfigDict:
  """The hybrid of `objective='gpt_bert'` (mlm_jax/objectives/gpt_bert.py): masked next-token prediction plus
  a share of causal rows, one LM head (Charpentier & Samuel, 2024)."""
  g = ml_collections.ConfigDict()
  # Share of each (micro)batch's rows trained causally (its last rows); the rest masked. GPT-BERT: 1:15.
  g.causal_share = 1 / 16
  return g


def loss_defaults() -> ml_collections.ConfigDict:
  """Terms every objective's LM head adds to its loss (mlm_jax/objectives/mlm.py, sparse_loss.py)."""
  o = ml_collections.ConfigDict()
  o.z_loss = 0.0                 # PaLM's z-loss: + z_loss x log(Z)^2 per predicted slot (1e-4 in PaLM, GPT-BERT); 0 = off
  return o


def data_defaults() -> ml_collections.ConfigDict:
  """The `data` section (data/): every field a str, int, float or tuple of str, so that config_flags
  can set any of them from the command line, e.g.
  --config.data.sources="('en=corpus/en/*.txt.gz','de=tsv:1:corpus/de/leipzig/*.gz')"."""
  d = ml_collections.ConfigDict()
  d.seq_len = 128
  # The tokenizer: a sentencepiece .model (its .special_ids.json next to it gives the special ids), a
  # tokenizer.json / vocab.txt (WordPiece, byte-level BPE), or a folder holding one (data/tokenizers/).
  d.tokenizer = ""
  # Training corpora, each 'name=spec' (the name labels logs and the mixing weights). Specs:
  #   GLOB[,GLOB]              text files, .gz read transparently (local or gs://)
  #   tsv:FIELD:GLOB           tab-separated text, column FIELD (Leipzig: tsv:1:..)
  #   jsonl:FIELD:GLOB         JSON lines, the string field FIELD of each record (HF datasets, C4: jsonl:text:..)
  #   tfds:NAME[/CFG]:SPLIT[:FEATURE]   a prepared TFDS dataset in `tfds_data_dir`
  #   tfrecord:GLOB            tf.train.Example with int64 `input_ids` (pre-tokenized docs)
  d.sources = ()
  # Held-out corpora (same syntax). Empty: hold out `eval_percent` % of the training documents
  # by a stable hash of their text (excluded from training, identical on every run and host).
  d.eval_sources = ()
  d.eval_percent = 1.0
  # Lines longer than this many bytes are cut into pieces of that size before tokenization
  # (counted as long_lines_cut): it bounds the tokenizer's memory per line (docs/design_notes.md#defaults).
  d.max_line_bytes = 1 << 16
  # True: any repaired or skipped input (invalid UTF-8, a cut line, an empty or truncated file)
  # is an error naming the file, instead of a warning and a count in the stats.
  d.strict = False
  d.doc_format = "line"          # line: a document per line | blank_line: blank-line-separated
  # segmented: documents packed whole, each with BOS/EOS, segment ids 1,2,.. and positions from 0
  #            (documents do not attend to each other); concat: RoBERTa FULL-SENTENCES stream.
  d.packing = "segmented"
  # segmented rows: 'best' = each document (chunk) goes into the open row with the least room that
  # still fits it, among `packing_window` open rows (the fullest is closed when a new one is
  # needed); 'next' = one open row, closed when a document does not fit (more padding:
  # docs/design_notes.md#packing-library). A config.json or data state without this field reads as
  # 'next', so such runs resume onto the rows they started on.
  d.packing_fit = PACKING_FIT
  d.packing_window = 256         # open rows; more = fuller rows, more memory (streaming: rows x seq_len)
  # Corpus i is drawn with p_i ∝ n_i^alpha, n_i = its size on disk (bytes; TFDS: examples) unless
  # `source_sizes` says otherwise. 1.0 = proportional, 0.3 = XLM-R, 0.0 = uniform.
  d.mix_alpha = 1.0
  d.source_sizes = ()            # optional 'name=number' overrides of n_i
  # Curricula (token stores only; mlm_jax/config/curricula.py): mix_alpha in phases, piecewise constant,
  # e.g. ('0:0.7', '2000:0.5', '4000:0.3'); and sources that join later, e.g. ('bn=2000',): weight
  # 0 before that step. Phases are in steps of the run's global batch size.
  d.mix_alpha_schedule = ()
  d.source_start_steps = ()
  d.shuffle_buffer = 10000       # documents; 0 = no shuffle (file order is still shuffled)
  d.shuffle_files = True
  # Multi-process runs: 'shard' = each process reads its own part of the corpus (default, scales);
  # 'slice' = each reads the whole stream and keeps its rows of the global batch, so batches are
  # identical for any process count (small corpora, exact reproducibility).
  d.per_host = "shard"
  d.tfds_data_dir = ""           # '' = TFDS default (~/tensorflow_datasets)
  # tf.data performance knobs (tools/benchmark.py input reports what they were).
  d.tokenize_batch = 128         # documents per tokenizer call
  d.num_parallel_calls = -1      # -1 = tf.data.AUTOTUNE
  d.num_parallel_reads = 4       # files read at once (deterministic interleave)
  d.threads = 0                  # tf.data private thread pool size; 0 = TF's shared pool
  d.prefetch = 4                 # ready batches buffered ahead of the training step
  # Token stores: processes building training batches ahead (0 = each batch is built in the
  # training process when asked). Batches do not depend on it; tools/benchmark.py input --store
  # measures what it gains.
  d.store_workers = 0
  return d


def default_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "pretraining"         # what the config is for (fine-tuning configs: "finetuning")
  c.seed = 0
  # mlm | mlm+nsp (BERT next-sentence prediction) | mlm+sop (ALBERT sentence order) | electra
  # (replaced-token detection, mlm_jax/objectives/electra.py) | gpt_bert (masked next-token prediction plus
  # causal rows, mlm_jax/objectives/gpt_bert.py); the sentence objectives read pairs of sentences
  # from a token store (mlm_jax/data/store/pairs.py).
  c.objective = "mlm"
  # A workdir (its latest checkpoint) or a folder written by `convert_checkpoint.py from_hf`:
  # parameters start from there, the optimizer and data stream start fresh.
  c.init_from = ""
  # WORKDIR:STEP of another run: start from that checkpoint's whole state (parameters, optimizer, data
  # position, phase), then train under this config (mlm_jax/workdir/branch.py); the source is only read.
  c.branch_from = ""
  # Demo only: write the bundled demo corpus (Python's own documentation text) to WORKDIR/demo_corpus.
  c.demo_corpus = False
  # Phases of one run (mlm_jax/config/phases.py, docs/phases.md): dicts of a name, end_step or
  # end_tokens, and "section.field" overrides (seq_len, batch size, RoPE theta, masking, data, LR).
  c.phases = ()

  c.tokenizer = tokenizer_defaults()   # used when data.tokenizer is ''
  c.model = model_defaults()
  c.masking = masking_defaults()
  c.optimizer = optimizer_defaults()
  c.data = data_defaults()
  c.train = loop_defaults()
  c.electra = electra_defaults()       # read when objective='electra'
  c.gpt_bert = gpt_bert_defaults()     # read when objective='gpt_bert'
  c.loss = loss_defaults()

  # ---- mesh and sharding (mlm_jax/model/sharding.py) ----
  # Axis sizes over all devices (-1 = fill). On several TPU slices, dcn_* says how many slices each axis
  # spans (the DCN part; the rest of the axis stays inside a slice's ICI); their product is the number
  # of slices, -1 = the slices left. The default puts data parallelism across slices.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, dcn_data=-1, dcn_fsdp=1, dcn_tensor=1))
  # CPU only: the training binary splits this process's CPU into this many JAX devices (jax_num_cpu_devices)
  # and shards the batch over them; 0 = JAX's default (one device, or XLA_FLAGS' host device count). XLA:CPU
  # runs a small model's many small operations on one device at a time; on a 2-core machine two devices run
  # them side by side (~1.1x for configs/en_cpu_hour.py, and ~1.05x more from XLA's concurrency-optimized
  # schedule, which more than one device turns on), but each holds a copy of the state: small models only
  # (docs/performance.md#cpu-devices).
  c.cpu_devices = 0
  s = c.sharding = ml_collections.ConfigDict()
  # logical axis -> mesh axis (or tuple of axes, or None = replicated). MaxText-style rules.
  s.rules = (
      ("batch", ("data", "fsdp")),
      ("vocab", "tensor"),
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("kv", None),
      ("mlp", "tensor"),
      ("norm", None),
      ("positions", None),
      ("layers", None),
  )
  return c
