#!/usr/bin/python3
"""A grpcurl-style client for any LEDE process; needs no .proto files.

It asks the server's reflection service (grpc.reflection.v1alpha) for the
descriptors, builds the message classes at runtime and converts JSON with
google.protobuf.json_format. Only Debian's python3-grpcio and python3-protobuf
are needed (grpcio-reflection is not: its messages are built here too).

examples:
  scripts/grpc_call.py 127.0.0.1:50051 list
  scripts/grpc_call.py 127.0.0.1:50051 describe lede.v1.Policy
  scripts/grpc_call.py 127.0.0.1:50051 describe lede.v1.DecideRequest
  scripts/grpc_call.py 127.0.0.1:50051 call lede.v1.Generation/Generate \\
      '{"prompt": "Once upon a time", "max_new_tokens": 32}'
  scripts/grpc_call.py --timeout 5 --max-messages 1 127.0.0.1:50053 \\
      call lede.v1.Policy/WatchPolicy '{}'

Each response is printed as one JSON line (proto field names). gRPC errors
print "CODE: message" on stderr and exit 1.
"""
import argparse
import json
import sys

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory, text_format

FDP = descriptor_pb2.FieldDescriptorProto
STATUS_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


def message_class(desc):
    """The message class for desc, with whichever API this protobuf has."""
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.22
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def _reflection_classes():
    """ServerReflectionRequest/Response built from a hand-written descriptor."""
    f = descriptor_pb2.FileDescriptorProto(
        name="grpc/reflection/v1alpha/reflection.proto",
        package="grpc.reflection.v1alpha", syntax="proto3")

    def msg(name, fields, oneof=None):
        m = f.message_type.add(name=name)
        if oneof:
            m.oneof_decl.add(name=oneof)
        for fname, num, ftype, label, type_name, in_oneof in fields:
            fd = m.field.add(name=fname, number=num, type=ftype, label=label)
            if type_name:
                fd.type_name = ".grpc.reflection.v1alpha." + type_name
            if in_oneof:
                fd.oneof_index = 0

    opt, rep, S, M = FDP.LABEL_OPTIONAL, FDP.LABEL_REPEATED, FDP.TYPE_STRING, FDP.TYPE_MESSAGE
    msg("ServerReflectionRequest", [
        ("host", 1, S, opt, None, False),
        ("file_by_filename", 3, S, opt, None, True),
        ("file_containing_symbol", 4, S, opt, None, True),
        ("list_services", 7, S, opt, None, True)], oneof="message_request")
    msg("FileDescriptorResponse", [("file_descriptor_proto", 1, FDP.TYPE_BYTES, rep, None, False)])
    msg("ServiceResponse", [("name", 1, S, opt, None, False)])
    msg("ListServiceResponse", [("service", 1, M, rep, "ServiceResponse", False)])
    msg("ErrorResponse", [("error_code", 1, FDP.TYPE_INT32, opt, None, False),
                          ("error_message", 2, S, opt, None, False)])
    msg("ServerReflectionResponse", [
        ("valid_host", 1, S, opt, None, False),
        ("original_request", 2, M, opt, "ServerReflectionRequest", False),
        ("file_descriptor_response", 4, M, opt, "FileDescriptorResponse", True),
        ("list_services_response", 6, M, opt, "ListServiceResponse", True),
        ("error_response", 7, M, opt, "ErrorResponse", True)], oneof="message_response")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (message_class(pool.FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest")),
            message_class(pool.FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse")))


# grpc's C++ default health service is not known to reflection: a built-in copy.
HEALTH_PROTO = """
name: "grpc/health/v1/health.proto" package: "grpc.health.v1" syntax: "proto3"
message_type { name: "HealthCheckRequest"
  field { name: "service" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING } }
message_type { name: "HealthCheckResponse"
  field { name: "status" number: 1 label: LABEL_OPTIONAL type: TYPE_ENUM
          type_name: ".grpc.health.v1.HealthCheckResponse.ServingStatus" }
  enum_type { name: "ServingStatus" value { name: "UNKNOWN" number: 0 } value { name: "SERVING" number: 1 }
              value { name: "NOT_SERVING" number: 2 } value { name: "SERVICE_UNKNOWN" number: 3 } } }
service { name: "Health"
  method { name: "Check" input_type: ".grpc.health.v1.HealthCheckRequest"
           output_type: ".grpc.health.v1.HealthCheckResponse" }
  method { name: "Watch" input_type: ".grpc.health.v1.HealthCheckRequest"
           output_type: ".grpc.health.v1.HealthCheckResponse" server_streaming: true } }
"""


class ReflectionError(Exception):
    pass


class Reflector:
    """Fetches descriptors over reflection into a private DescriptorPool."""

    def __init__(self, channel, timeout):
        self.req_cls, self.resp_cls = _reflection_classes()
        self.stream = channel.stream_stream(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            request_serializer=self.req_cls.SerializeToString,
            response_deserializer=self.resp_cls.FromString)
        self.timeout = timeout
        self.pool = descriptor_pool.DescriptorPool()
        self.protos = {}  # file name -> FileDescriptorProto, fetched but maybe not added

    def _ask(self, **kw):
        resp = next(iter(self.stream(iter([self.req_cls(**kw)]), timeout=self.timeout)))
        if resp.HasField("error_response"):
            e = resp.error_response
            raise ReflectionError("%s: %s" % (STATUS_NAMES.get(e.error_code, e.error_code), e.error_message))
        return resp

    def list_services(self):
        return [s.name for s in self._ask(list_services="").list_services_response.service]

    def _take(self, resp):
        for raw in resp.file_descriptor_response.file_descriptor_proto:
            fd = descriptor_pb2.FileDescriptorProto.FromString(raw)
            self.protos.setdefault(fd.name, fd)

    def _add(self, name):
        """Adds file name after its dependencies (depth first), fetching any missing."""
        try:
            self.pool.FindFileByName(name)
            return
        except KeyError:
            pass
        if name not in self.protos:
            self._take(self._ask(file_by_filename=name))
        for dep in self.protos[name].dependency:
            self._add(dep)
        self.pool.Add(self.protos[name])

    def load_symbol(self, symbol):
        try:
            resp = self._ask(file_containing_symbol=symbol)
        except ReflectionError as e:
            if symbol.startswith("grpc.health.v1.") and "grpc/health/v1/health.proto" not in self.protos:
                fd = text_format.Parse(HEALTH_PROTO, descriptor_pb2.FileDescriptorProto())
                self.protos[fd.name] = fd
                self._add(fd.name)
                return
            raise ReflectionError("%s (%s)" % (e, symbol))
        self._take(resp)
        # The first file is the one that defines the symbol; the others are its deps.
        first = descriptor_pb2.FileDescriptorProto.FromString(
            resp.file_descriptor_response.file_descriptor_proto[0])
        self._add(first.name)

    def find(self, symbol):
        self.load_symbol(symbol)
        for kind, finder in (("service", self.pool.FindServiceByName),
                             ("message", self.pool.FindMessageTypeByName),
                             ("enum", self.pool.FindEnumTypeByName),
                             ("method", self.pool.FindMethodByName)):
            try:
                return kind, finder(symbol)
            except KeyError:
                continue
        raise ReflectionError("NOT_FOUND: symbol %s is not a service, method, message or enum" % symbol)


TYPE_NAMES = {getattr(FDP, n): n[5:].lower() for n in dir(FDP) if n.startswith("TYPE_")}


def _streaming(method):
    proto = descriptor_pb2.MethodDescriptorProto()
    method.CopyToProto(proto)
    return proto.client_streaming, proto.server_streaming


def _rpc_line(m):
    cs, ss = _streaming(m)
    return "rpc %s(%s%s) returns (%s%s);" % (m.name, "stream " if cs else "", m.input_type.full_name,
                                            "stream " if ss else "", m.output_type.full_name)


def _field_type(f):
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        k, v = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return "map<%s, %s>" % (_field_type(k), _field_type(v))
    if f.message_type is not None:
        return f.message_type.full_name
    if f.enum_type is not None:
        return f.enum_type.full_name
    return TYPE_NAMES[f.type]


def describe(kind, d):
    if kind == "method":
        return _rpc_line(d)
    if kind == "service":
        lines = ["  " + _rpc_line(m) for m in d.methods]
    elif kind == "enum":
        lines = ["  %s = %d;" % (v.name, v.number) for v in d.values]
    else:
        lines = []
        for f in d.fields:
            t = _field_type(f)
            label = "repeated " if f.label == FDP.LABEL_REPEATED and not t.startswith("map<") else ""
            oneof = "  // oneof %s" % f.containing_oneof.name if f.containing_oneof is not None else ""
            lines.append("  %s%s %s = %d;%s" % (label, t, f.name, f.number, oneof))
    return "\n".join(["%s %s {" % (kind, d.full_name)] + lines + ["}"])


def call(channel, reflector, full_method, body, timeout, max_messages):
    service, _, name = full_method.replace("/", ".").rpartition(".")
    kind, svc = reflector.find(service)
    if kind != "service" or name not in svc.methods_by_name:
        raise ReflectionError("NOT_FOUND: no method %s in %s" % (name, service))
    m = svc.methods_by_name[name]
    req_cls, resp_cls = message_class(m.input_type), message_class(m.output_type)
    try:
        request = json_format.Parse(body, req_cls(), descriptor_pool=reflector.pool)
    except json_format.ParseError as e:
        raise ReflectionError("INVALID_ARGUMENT: bad request JSON for %s: %s" % (m.input_type.full_name, e))
    client_streaming, server_streaming = _streaming(m)
    path = "/%s/%s" % (svc.full_name, m.name)
    ser, de = req_cls.SerializeToString, resp_cls.FromString
    if client_streaming:
        multi = channel.stream_stream if server_streaming else channel.stream_unary
        responses = multi(path, ser, de)(iter([request]), timeout=timeout)
    else:
        multi = channel.unary_stream if server_streaming else channel.unary_unary
        responses = multi(path, ser, de)(request, timeout=timeout)
    if not server_streaming:
        responses = [responses]
    for n, resp in enumerate(responses, 1):
        print(json.dumps(json_format.MessageToDict(resp, preserving_proto_field_name=True,
                                                   descriptor_pool=reflector.pool)), flush=True)
        if max_messages and n >= max_messages:
            if server_streaming:
                responses.cancel()
            break


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeout", type=float, default=None, help="deadline of each RPC, seconds")
    p.add_argument("--max-messages", type=int, default=0,
                   help="stop a server stream after N messages (0 = until it ends)")
    p.add_argument("addr", help="host:port")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the services")
    d = sub.add_parser("describe", help="describe a service, method, message or enum")
    d.add_argument("symbol")
    c = sub.add_parser("call", help="call a method with a JSON request")
    c.add_argument("method", help="package.Service/Method")
    c.add_argument("body", nargs="?", default="{}", help="the request as JSON (default {})")
    args = p.parse_args(argv)

    with grpc.insecure_channel(args.addr) as channel:
        reflector = Reflector(channel, args.timeout)
        try:
            if args.cmd == "list":
                print("\n".join(sorted(reflector.list_services())))
            elif args.cmd == "describe":
                print(describe(*reflector.find(args.symbol)))
            else:
                call(channel, reflector, args.method, args.body, args.timeout, args.max_messages)
        except grpc.RpcError as e:
            print("%s: %s" % (e.code().name, e.details()), file=sys.stderr)
            return 1
        except ReflectionError as e:
            print(str(e), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
