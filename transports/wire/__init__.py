"""The wire floor: the vocabulary every layer stands on, and nothing above it.

Reason codes, the canonical msgpack codec and its shape walk, JSON text, node identity and PeerIDs, the signed
offer and result messages, and the coordinator's signed agent requests and refusal codes. Nothing here imports
`mesh` or the rest of `transports` (tests/test_layers.py): transports, the node, the coordinator and the tools all
speak these messages, so they live below all of them.
"""
