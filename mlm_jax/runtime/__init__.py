"""Process setup for every binary and tool: environment, allocator, logging, TensorFlow, distributed init,
one-line errors and the exit. `from mlm_jax import runtime` is how binaries, tools and library code reach it.

Some of it must happen before jax or TensorFlow is imported, so importing the package runs `bootstrap()`
and no module here imports either at top level. What each setting does and why: docs/design_notes.md#runtime.
"""
from mlm_jax.runtime.allocator import choose_allocator, memory_policy
from mlm_jax.runtime.distributed import first_process_then_all, peer_lost, sync_processes
from mlm_jax.runtime.environment import CPU_XLA_FLAGS, accelerator_present, configure, quiet
from mlm_jax.runtime.log_setup import add_verbosity_flag, setup_tool_logging
from mlm_jax.runtime.one_line_errors import report_user_error, run
from mlm_jax.runtime.startup import PROGRAMS, bootstrap, start, use_cpu_devices
from mlm_jax.runtime.teardown import exit_now
from mlm_jax.runtime.tensorflow_import import stderr_to, tensorflow
