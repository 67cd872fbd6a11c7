"""The plan format the TensorRT loader reads: manifests, graph I/O specs, GPU targets and the TensorRT libraries."""
