"""What the user set and what resolution derived stay apart.

Provisioning (training/provision.py) writes what a run needs on disk; resolution (training/resolve.py) only
reads: it leaves the user's config as it was and returns the derived values next to it, and
WORKDIR/config.json keeps the two apart (workdir/files.py, workdir/migrate.py).
"""
import json
import os

import pytest

from mlm_jax.config import derived as derived_lib
from mlm_jax.config.defaults import default_config
from mlm_jax.errors import ConfigError
from mlm_jax.training import provision, resolve
from mlm_jax.workdir import files as workdir_files, migrate

# Every field resolution derives for a plain pretraining run -> the value of it a user gives to mean
# "derive it" (None: not a user's field at all, the tokenizer's). Others are derived when the config asks
# for them: an init_from source's model and tokenizer, a branch_from's step, `{workdir}` in data paths,
# an objective's own (NSP: model.use_pooler), the phases' record and lengths.
DERIVED = {
    "model.vocab_size": 0,              # the tokenizer's
    "model.attention_impl": "auto",     # the platform's kernel
    "model.matmul": "auto",             # the platform's matmul
    "masking.max_predictions": 0,       # from the mask rate, the sequence length and the platform
    "masking.mask_id": None,            # the tokenizer's
    "masking.special_ids": None,        # the tokenizer's
}


def _get(tree: dict, dotted: str, default="absent"):
  section, field = dotted.split(".")
  return tree.get(section, {}).get(field, default)


def test_the_user_facing_defaults_hold_no_derived_value():
  """A derived field is absent from the defaults, or holds the value that asks for it to be derived."""
  defaults = default_config().to_dict()
  for dotted, auto in DERIVED.items():
    assert _get(defaults, dotted) == ("absent" if auto is None else auto), dotted
  assert set(derived_lib.FROM_TOKENIZER) == {k for k, v in DERIVED.items() if v is None}


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory):
  """A tiny run whose tokenizer provisioning trains on 100 kB of the demo corpus (Python's documentation):
  (the user's config, workdir)."""
  from mlm_jax.data import demo_corpus
  root = tmp_path_factory.mktemp("resolution")
  corpus = demo_corpus.write(str(root / "corpus"), max_bytes=100_000)
  c = default_config()
  c.demo_corpus = False
  c.tokenizer.vocab_size = 400
  c.data.update(sources=(corpus,), seq_len=32)
  c.model.update(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=34)
  workdir = root / "run"
  workdir.mkdir()
  with pytest.raises(ConfigError, match="no trained tokenizer"):   # resolution trains nothing
    resolve.resolve_pretraining(c, str(workdir))
  assert not os.listdir(workdir)
  provision.pretraining(c, str(workdir))
  assert (workdir / "tokenizer" / "spm.model").exists()
  return c, workdir


def test_resolution_leaves_the_user_config_and_the_workdir_as_they_were(provisioned):
  c, workdir = provisioned
  before, files_before = c.to_dict(), sorted(os.listdir(workdir))
  run = resolve.resolve_pretraining(c, str(workdir))
  assert c.to_dict() == before and sorted(os.listdir(workdir)) == files_before
  assert run.user is not c and run.user.to_dict() == before
  derived = run.derived
  for dotted, auto in DERIVED.items():
    value = _get(derived, dotted)
    assert value != "absent" and value != auto, (dotted, value)
    assert _get(derived_lib.as_json(run.config), dotted) == value
  assert _get(derived, "model.vocab_size") == run.tokenizer.vocab_size == 400
  assert _get(derived, "masking.mask_id") == run.tokenizer.mask_id
  assert derived_lib.merge(derived_lib.as_json(run.user), derived) == derived_lib.as_json(run.config)


def test_config_json_keeps_the_users_config_and_the_derived_values_apart(provisioned, tmp_path):
  c, workdir = provisioned
  run = resolve.resolve_pretraining(c, str(workdir))
  workdir_files.write_config(run.config, str(tmp_path), run.user)
  record = json.loads((tmp_path / "config.json").read_text())
  assert sorted(record) == ["config", "derived", "version"] and record["version"] == migrate.VERSION
  assert record["config"] == derived_lib.as_json(c) and record["derived"] == run.derived
  for dotted, auto in DERIVED.items():
    assert _get(record["config"], dotted) == ("absent" if auto is None else auto), dotted
  read = workdir_files.read_config(str(tmp_path))
  assert derived_lib.as_json(read) == derived_lib.as_json(run.config)


def test_resolving_for_compile_leaves_the_user_config_as_it_was():
  c = default_config()
  c.model.vocab_size = 128
  before = c.to_dict()
  run = resolve.resolve_for_compile(c, platform="cpu")
  assert c.to_dict() == before and run.user.to_dict() == before
  assert _get(run.derived, "masking.mask_id") == 127 and _get(run.derived, "masking.max_predictions") > 0
