"""A cluster's health for scripts: `python -m shardcoord.check [ADDR]`.

    $ python -m shardcoord.check 127.0.0.1:7400
    coordinator 127.0.0.1:7400: SERVING (liveness SERVING)
    workers: 2 alive of 2
      w0  rank 0  ALIVE  cpu  gloo  host-a  127.0.0.1:40123
      w1  rank 1  ALIVE  cpu  gloo  host-a  127.0.0.1:40125

Each coordinator of ADDR ("host:port", or "host:port,host:port" for several on etcd; default
$SHARDCOORD_ADDR, then 127.0.0.1:7400) is asked grpc.health.v1 Check for readiness ("") and
"liveness"; the workers come from the one that serves (ListWorkers, with $SHARDCOORD_TOKEN or
--token). Exit status: 0 when a coordinator is SERVING (and, with --workers N, at least N
workers are ALIVE), 1 when none is (unreachable or NOT_SERVING), 2 for bad arguments, 3 when
fewer than --workers N are alive. --json prints one object instead.
"""

import argparse
import json
import sys

import grpc

from . import _errors
from .client import Client, channel_credentials, default_address, default_token
from ._proto import pb

# grpc.health.v1.HealthCheckResponse.ServingStatus, read from the raw reply (Debian's grpcio
# has no grpc_health module): field 1, a varint.
_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _health_request(service):
    """A serialized HealthCheckRequest{service}: field 1, length-delimited (b'' for "")."""
    data = service.encode()
    if not data:
        return b""
    if len(data) > 127:
        raise ValueError(f"service name {service!r} is too long")
    return b"\x0a" + bytes([len(data)]) + data


def _health_status(reply):
    """The status of a serialized HealthCheckResponse (proto3: absent means UNKNOWN)."""
    i, status = 0, 0
    while i < len(reply):
        key = reply[i]
        i += 1
        if key == 0x08:  # field 1, varint
            value, shift = 0, 0
            while True:
                byte = reply[i]
                i += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            status = value
        else:
            break  # Nothing else is in a HealthCheckResponse.
    return _STATUS.get(status, f"STATUS_{status}")


def health(address, service="", timeout=5.0, credentials=None):
    """The grpc.health.v1 status of `service` at one `address`: "SERVING", "NOT_SERVING",
    "SERVICE_UNKNOWN", or "UNREACHABLE: <gRPC status> <details>"."""
    channel = (grpc.insecure_channel(address) if credentials is None
               else grpc.secure_channel(address, credentials))
    try:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        reply = check(_health_request(service), timeout=timeout)
        return _health_status(reply)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return "SERVICE_UNKNOWN"
        return f"UNREACHABLE: {e.code().name} {e.details() or ''}".rstrip()
    finally:
        channel.close()


def _worker_state(w):
    if w.leaving and w.state == pb.ALIVE:
        return "LEAVING"
    return pb.WorkerState.Name(w.state)


def cluster_health(address=None, token=None, tls_ca=None, tls_cert=None, tls_key=None,
                   timeout=5.0):
    """A dict: "coordinators" (per address: "address", "ready", "liveness"), "serving"
    (whether one is SERVING), "workers" (name, rank, state, ... of each; None when no
    coordinator serves or ListWorkers failed) and "error" (why workers is None, or None)."""
    address = address or default_address()
    credentials = channel_credentials(tls_ca, tls_cert, tls_key)
    coordinators = []
    for one in [a.strip() for a in address.split(",") if a.strip()]:
        coordinators.append({
            "address": one,
            "ready": health(one, "", timeout, credentials),
            "liveness": health(one, "liveness", timeout, credentials)})
    serving = any(c["ready"] == "SERVING" for c in coordinators)
    result = {"coordinators": coordinators, "serving": serving, "workers": None, "error": None}
    if not serving:
        result["error"] = "no coordinator is SERVING"
        return result
    client = Client(address, timeout=timeout, token=token or default_token(), tls_ca=tls_ca,
                    tls_cert=tls_cert, tls_key=tls_key, retry_for=timeout)
    try:
        result["workers"] = [{
            "name": w.name, "rank": w.rank, "state": _worker_state(w), "device": w.device,
            "backend": w.backend, "host": w.host, "address": w.address}
            for w in client.workers()]
    except _errors.Error as e:
        result["error"] = f"ListWorkers: {e.code} {e.message}"
    finally:
        client.close()
    return result


def _print_text(result, out):
    for c in result["coordinators"]:
        print(f"coordinator {c['address']}: {c['ready']} (liveness {c['liveness']})", file=out)
    workers = result["workers"]
    if workers is None:
        print(f"workers: unknown ({result['error']})", file=out)
        return
    alive = sum(w["state"] == "ALIVE" for w in workers)
    print(f"workers: {alive} alive of {len(workers)}", file=out)
    for w in workers:
        print(f"  {w['name']}  rank {w['rank']}  {w['state']}  {w['device']}  {w['backend']}  "
              f"{w['host']}  {w['address']}", file=out)


def main(argv=None, out=sys.stdout):
    parser = argparse.ArgumentParser(prog="python -m shardcoord.check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("address", nargs="?", default=None,
                        help="host:port[,host:port] (default $SHARDCOORD_ADDR, then "
                             "127.0.0.1:7400)")
    parser.add_argument("--workers", type=int, default=0, metavar="N",
                        help="also fail (exit 3) unless at least N workers are ALIVE")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call")
    parser.add_argument("--token", default=None, help="bearer token (default $SHARDCOORD_TOKEN)")
    parser.add_argument("--tls-ca", default=None, help="CA certificate (PEM) for TLS")
    parser.add_argument("--tls-cert", default=None, help="client certificate (PEM)")
    parser.add_argument("--tls-key", default=None, help="client key (PEM)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error(f"--timeout must be > 0, not {args.timeout}")
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, not {args.workers}")
    try:
        result = cluster_health(args.address, token=args.token, tls_ca=args.tls_ca,
                                tls_cert=args.tls_cert, tls_key=args.tls_key,
                                timeout=args.timeout)
    except ValueError as e:  # e.g. a certificate file that cannot be read
        print(f"shardcoord.check: {e}", file=sys.stderr)
        return 2
    if not result["serving"]:
        code = 1
    elif args.workers and sum(w["state"] == "ALIVE" for w in result["workers"] or []) < \
            args.workers:
        code = 3
    else:
        code = 0
    result["exit"] = code
    if args.json:
        print(json.dumps(result, sort_keys=True), file=out)
    else:
        _print_text(result, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
