"""The ``XSpace`` protobuf message of the TensorFlow profiler (``tsl/profiler/protobuf/xplane.proto``), built from
a descriptor written out here, so that reading an ``.xplane.pb`` needs only ``protobuf`` -- not TensorFlow, whose
import takes seconds. The field numbers and types are the proto's; a test compares them with the ``xplane_pb2``
TensorFlow ships, where TensorFlow is installed.
"""
from __future__ import annotations

import functools

from mlms_nb._optional import require

_I64, _U64, _DOUBLE, _STRING, _BYTES, _MESSAGE = "int64", "uint64", "double", "string", "bytes", "message"
_PACKAGE = "mlms_nb.xplane"

#: message -> [(field, number, type, message type or None, repeated, oneof or None)]
FIELDS = {
    "XSpace": [("planes", 1, _MESSAGE, "XPlane", True, None), ("errors", 2, _STRING, None, True, None),
               ("warnings", 3, _STRING, None, True, None), ("hostnames", 4, _STRING, None, True, None)],
    "XPlane": [("id", 1, _I64, None, False, None), ("name", 2, _STRING, None, False, None),
               ("lines", 3, _MESSAGE, "XLine", True, None),
               ("event_metadata", 4, _MESSAGE, "XPlane.EventMetadataEntry", True, None),
               ("stat_metadata", 5, _MESSAGE, "XPlane.StatMetadataEntry", True, None),
               ("stats", 6, _MESSAGE, "XStat", True, None)],
    "XLine": [("id", 1, _I64, None, False, None), ("display_id", 10, _I64, None, False, None),
              ("name", 2, _STRING, None, False, None), ("display_name", 11, _STRING, None, False, None),
              ("timestamp_ns", 3, _I64, None, False, None), ("duration_ps", 9, _I64, None, False, None),
              ("events", 4, _MESSAGE, "XEvent", True, None)],
    "XEvent": [("metadata_id", 1, _I64, None, False, None), ("offset_ps", 2, _I64, None, False, "data"),
               ("num_occurrences", 5, _I64, None, False, "data"), ("duration_ps", 3, _I64, None, False, None),
               ("stats", 4, _MESSAGE, "XStat", True, None)],
    "XStat": [("metadata_id", 1, _I64, None, False, None), ("double_value", 2, _DOUBLE, None, False, "value"),
              ("uint64_value", 3, _U64, None, False, "value"), ("int64_value", 4, _I64, None, False, "value"),
              ("str_value", 5, _STRING, None, False, "value"), ("bytes_value", 6, _BYTES, None, False, "value"),
              ("ref_value", 7, _U64, None, False, "value")],
    "XEventMetadata": [("id", 1, _I64, None, False, None), ("name", 2, _STRING, None, False, None),
                       ("display_name", 4, _STRING, None, False, None), ("metadata", 3, _BYTES, None, False, None),
                       ("stats", 5, _MESSAGE, "XStat", True, None), ("child_id", 6, _I64, None, True, None)],
    "XStatMetadata": [("id", 1, _I64, None, False, None), ("name", 2, _STRING, None, False, None),
                      ("description", 3, _STRING, None, False, None)],
}
#: map fields of XPlane: entry name -> value message
MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}


def _add_fields(message, fields, descriptor_pb2) -> None:
    F = descriptor_pb2.FieldDescriptorProto
    types = {_I64: F.TYPE_INT64, _U64: F.TYPE_UINT64, _DOUBLE: F.TYPE_DOUBLE, _STRING: F.TYPE_STRING,
             _BYTES: F.TYPE_BYTES, _MESSAGE: F.TYPE_MESSAGE}
    oneofs: list[str] = []
    for name, number, kind, message_type, repeated, oneof in fields:
        field = message.field.add(name=name, number=number, type=types[kind],
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
        if message_type:
            field.type_name = f".{_PACKAGE}.{message_type}"
        if oneof:
            if oneof not in oneofs:
                oneofs.append(oneof)
                message.oneof_decl.add(name=oneof)
            field.oneof_index = oneofs.index(oneof)


@functools.lru_cache(maxsize=1)
def xspace_class():
    """The ``XSpace`` message class (in a descriptor pool of its own, apart from TensorFlow's)."""
    descriptor_pb2 = require("google.protobuf.descriptor_pb2", "reading a TensorFlow profile (.xplane.pb)")
    from google.protobuf import descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="mlms_nb/xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in FIELDS.items():
        message = file.message_type.add(name=name)
        _add_fields(message, fields, descriptor_pb2)
        if name == "XPlane":
            for entry, value in MAP_ENTRIES.items():
                nested = message.nested_type.add(name=entry)
                nested.options.map_entry = True
                _add_fields(nested, [("key", 1, _I64, None, False, None),
                                     ("value", 2, _MESSAGE, value, False, None)], descriptor_pb2)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.XSpace"))
