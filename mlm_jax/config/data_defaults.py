"""Defaults of the `config.data` section (owned by the input pipeline).

Every field is a str, int, float or tuple of str, so that ml_collections' config_flags can set
any of them from the command line, e.g.
  --config.data.sources="('en=corpus/en/*.txt.gz','de=tsv:1:corpus/de/leipzig/*.gz')"
"""
import ml_collections


def data_defaults() -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.seq_len = 128
  # The tokenizer: a sentencepiece .model (its .special_ids.json next to it gives the special ids), a
  # tokenizer.json / vocab.txt (WordPiece, byte-level BPE), or a folder holding one (data/tokenizers/).
  d.tokenizer = ""
  # Training corpora, each 'name=spec' (the name labels logs and the mixing weights). Specs:
  #   GLOB[,GLOB]              text files, .gz read transparently (local or gs://)
  #   tsv:FIELD:GLOB           tab-separated text, column FIELD (Leipzig: tsv:1:..)
  #   tfds:NAME[/CFG]:SPLIT[:FEATURE]   a prepared TFDS dataset in `tfds_data_dir`
  #   tfrecord:GLOB            tf.train.Example with int64 `input_ids` (pre-tokenized docs)
  d.sources = ()
  # Held-out corpora (same syntax). Empty: hold out `eval_percent` % of the training documents
  # by a stable hash of their text (excluded from training, identical on every run and host).
  d.eval_sources = ()
  d.eval_percent = 1.0
  # Lines longer than this many bytes are cut into pieces of that size before tokenization
  # (counted as long_lines_cut). It bounds memory: sentencepiece's lattice over one 10 MB line
  # takes gigabytes. 64 KiB is ~16k tokens, far beyond any seq_len, above almost every real
  # paragraph, and costs ~100 MB in the worst case per line being tokenized.
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
  # needed): ~1-3 % padding on short documents; 'next' = one open row, closed when a document does
  # not fit (10-20 % padding on sentences). A config.json or data state without this field is from
  # before best-fit and reads as 'next', so such runs resume onto the rows they started on.
  d.packing_fit = "best"
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
