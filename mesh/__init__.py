"""edgecoder-mesh: mesh."""
