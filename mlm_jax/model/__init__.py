"""The model: the encoder, attention kernels, sharding rules and mesh, FLOPs, parameter layouts."""
