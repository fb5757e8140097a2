"""edgecoder-mesh: transports."""
