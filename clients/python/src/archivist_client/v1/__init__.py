"""Generated protobuf and gRPC stubs for `archivist.v1` (see generate.py).

Do not edit the `archivist_pb2*` modules by hand: run
`python clients/python/generate.py` after changing the proto.
"""
