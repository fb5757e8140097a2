"""`python -m mesh.coordinator --db FILE --listen HOST:PORT`: the coordinator without the `edgecoder` group."""

from mesh.coordinator.cli import coordinator

coordinator(prog_name="python -m mesh.coordinator")
