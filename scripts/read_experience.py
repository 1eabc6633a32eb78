#!/usr/bin/python3
"""Reads LEDE experience shards (shared/experience/experience.h, docs/design.md §5).

A shard is the 8-byte magic b"LEDEXP1\\n" followed by records, each framed as
  uint32 LE payload length | uint32 LE zlib CRC-32 of the payload | payload
where the payload is a serialized lede.v1.Transition
(proto/lede/v1/experience.proto). Given a directory, every "*.lexp" file in it
(not recursive) is read in name order, as ReadShards() does in C++.

Usage:
  read_experience.py SHARD_OR_DIR         summary: records per shard, counts
                                          per phase/action, mean reward
  read_experience.py SHARD_OR_DIR --json  one JSON object per record

Needs only Python 3, the protobuf module (Debian: python3-protobuf) and protoc
(protobuf-compiler), both installed by scripts/bootstrap: the Python module
for experience.proto is generated with `protoc --python_out` into a temporary
directory at run time ($PROTOC overrides the protoc found on PATH).

Exit status: 0 when every shard was read whole; 1 when a shard is bad (wrong
magic, truncated record, checksum mismatch, unparsable record: the records
before the bad one are still counted or printed, the error goes to stderr) or
the path does not exist; 2 when protobuf or protoc is missing.
"""
import argparse
import collections
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import zlib

MAGIC = b"LEDEXP1\n"
SUFFIX = ".lexp"
HEADER = struct.Struct("<II")  # payload length, CRC-32 of the payload
MAX_RECORD_BYTES = 16 << 20  # kMaxRecordBytes in shared/experience/experience.h

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO = os.path.join("proto", "lede", "v1", "experience.proto")


class ShardError(Exception):
    """A bad shard; the message names the record, its offset and the defect."""


def fail_setup(message):
    print("read_experience: " + message, file=sys.stderr)
    sys.exit(2)


def load_experience_pb2():
    """Generates experience_pb2 with protoc into a temporary directory and imports it."""
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        fail_setup("the Python protobuf module is missing from %s (apt-get install "
                   "python3-protobuf, or run this script with /usr/bin/python3)" % sys.executable)
    protoc = os.environ.get("PROTOC") or shutil.which("protoc")
    if not protoc:
        fail_setup("protoc not found (apt-get install protobuf-compiler)")
    with tempfile.TemporaryDirectory(prefix="lede_pb2_") as out:
        proc = subprocess.run([protoc, "-I", REPO_ROOT, "--python_out=" + out,
                               os.path.join(REPO_ROOT, PROTO)],
                              stderr=subprocess.PIPE, universal_newlines=True)
        if proc.returncode != 0:
            fail_setup("protoc failed on %s: %s" % (PROTO, proc.stderr.strip()))
        generated = os.path.join(out, "proto", "lede", "v1", "experience_pb2.py")
        spec = importlib.util.spec_from_file_location("experience_pb2", generated)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


def read_shard(path, pb2):
    """Yields the Transitions of one shard; raises ShardError at the first bad record."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise ShardError("bad file magic (not an experience shard)")
        offset = len(MAGIC)
        index = 0
        while True:
            where = "record %d at offset %d: " % (index, offset)
            header = f.read(HEADER.size)
            if not header:
                return
            if len(header) != HEADER.size:
                raise ShardError(where + "truncated record header")
            length, crc = HEADER.unpack(header)
            if length > MAX_RECORD_BYTES:
                raise ShardError(where + "record length %d exceeds %d (corrupt)"
                                 % (length, MAX_RECORD_BYTES))
            payload = f.read(length)
            if len(payload) != length:
                raise ShardError(where + "truncated payload (%d of %d bytes)"
                                 % (len(payload), length))
            if zlib.crc32(payload) & 0xFFFFFFFF != crc:
                raise ShardError(where + "checksum mismatch")
            record = pb2.Transition()
            try:
                record.ParseFromString(payload)
            except Exception as e:  # google.protobuf.message.DecodeError
                raise ShardError(where + "unparsable lede.v1.Transition: %s" % e)
            yield record
            offset += HEADER.size + length
            index += 1


def shard_paths(path):
    """A file as given, or the *.lexp files under a directory (recursively: a
    store keeps them under <prefix>/<date>/), in path order; temp files
    (names starting with '.') are skipped."""
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            found += [os.path.join(root, f) for f in files if f.endswith(SUFFIX) and not f.startswith(".")]
        return sorted(found)
    return [path]


def to_json(record, json_format):
    try:
        obj = json_format.MessageToDict(record, preserving_proto_field_name=True,
                                        including_default_value_fields=True)
    except TypeError:  # protobuf >= 5.26 renamed the option
        obj = json_format.MessageToDict(record, preserving_proto_field_name=True,
                                        always_print_fields_with_no_presence=True)
    return json.dumps(obj, sort_keys=True)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="SHARD_OR_DIR")
    parser.add_argument("--json", action="store_true", help="print one JSON object per record")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... --json | head` ends quietly
    if not os.path.exists(args.path):
        print("read_experience: %s: no such file or directory" % args.path, file=sys.stderr)
        return 1

    pb2 = load_experience_pb2()
    from google.protobuf import json_format

    phase_names = {v.number: v.name for v in pb2.Phase.DESCRIPTOR.values}
    action_names = {v.number: v.name for v in pb2.ExitAction.DESCRIPTOR.values}
    counts = collections.Counter()
    reward_sum = 0.0
    total = 0
    bad = 0
    paths = shard_paths(args.path)
    for path in paths:
        n = 0
        error = None
        try:
            for record in read_shard(path, pb2):
                n += 1
                if args.json:
                    print(to_json(record, json_format))
                else:
                    counts[(phase_names.get(record.phase, str(record.phase)),
                            action_names.get(record.action, str(record.action)))] += 1
                    reward_sum += record.reward
        except ShardError as e:
            error = str(e)
        except OSError as e:
            error = "cannot read: %s" % e
        total += n
        if error is not None:
            bad += 1
            print("read_experience: bad shard %s (%d records read): %s" % (path, n, error),
                  file=sys.stderr)
        if not args.json:
            print("%s: %d records%s" % (path, n, "" if error is None else " (BAD: %s)" % error))

    if not args.json:
        print("total: %d records in %d shards (%d bad)" % (total, len(paths), bad))
        for (phase, action), n in sorted(counts.items()):
            print("  %-20s %-22s %d" % (phase, action, n))
        if total:
            print("mean reward: %.6f" % (reward_sum / total))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
