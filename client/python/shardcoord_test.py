"""Tests the `shardcoord` package against a scripted Coordinator servicer on loopback (port 0),
and the old `shardcoord_client` module over it. Argument: tools/dev_certs.sh (certificates for
the TLS tests are made in $TEST_TMPDIR)."""

import array
import concurrent.futures
import io
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import unittest
from unittest import mock

import grpc
import numpy as np

import shardcoord as sc
import shardcoord_client
from shardcoord import layouts, pb, pb_grpc


class FakeCoordinator(pb_grpc.CoordinatorServicer):
    def __init__(self):
        self.requests = {}
        self.upload_messages = []
        self.abort = False
        self.required_token = None
        self.unavailable_mesh_creates = 0
        self.sockets = {0: "/nonexistent/w0.sock", 1: "/nonexistent/w1.sock"}

    def ListWorkers(self, request, context):
        self.requests["metadata"] = dict(context.invocation_metadata())
        self.requests["list_workers"] = self.requests.get("list_workers", 0) + 1
        if self.required_token and self.requests["metadata"].get("authorization") != \
                f"Bearer {self.required_token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        return pb.ListWorkersResponse(workers=[
            pb.WorkerInfo(name="w0", rank=0, state=pb.ALIVE, device="cpu",
                          local_socket=self.sockets[0]),
            pb.WorkerInfo(name="w1", rank=1, state=pb.ALIVE, device="cuda:0",
                          local_socket=self.sockets[1])])

    def CreateMesh(self, request, context):
        self.requests.setdefault("create_mesh", []).append(request)
        if len(self.requests["create_mesh"]) <= self.unavailable_mesh_creates:
            context.abort(grpc.StatusCode.UNAVAILABLE, "recovering")
        return pb.MeshInfo(name=request.name, shape=request.shape)

    def CreateTensor(self, request, context):
        self.requests["create"] = request
        return pb.TensorInfo(name=request.name, shape=request.shape, dtype=request.dtype)

    def ListMeshes(self, request, context):
        return pb.ListMeshesResponse(meshes=[pb.MeshInfo(name="train", shape=[4]),
                                             pb.MeshInfo(name="infer", shape=[2, 2])])

    def CreateTensors(self, request, context):
        self.requests["create_many"] = request
        return pb.CreateTensorsResponse(created=len(request.tensors), bytes=64)

    def DeleteTensors(self, request, context):
        self.requests["delete_many"] = request
        return pb.DeleteTensorsResponse(deleted=len(request.names) + 2)

    def ListTensors(self, request, context):
        # 2,500 tensors t00000..t02499, pages of request.page_size (default 1,000).
        self.requests.setdefault("list", []).append(request)
        names = [f"t{i:05d}" for i in range(2500) if f"t{i:05d}".startswith(request.prefix)]
        start = 0
        if request.page_token:
            start = names.index(request.page_token) + 1
        size = request.page_size or 1000
        page = names[start:start + size]
        more = start + size < len(names)
        return pb.ListTensorsResponse(tensors=[pb.TensorInfo(name=n) for n in page],
                                      next_page_token=page[-1] if more else "")

    def GetTensor(self, request, context):
        if request.name != "lent":
            context.abort(grpc.StatusCode.NOT_FOUND, f"tensor '{request.name}' does not exist")
        # 6x4 f32, S(0) over ranks 0 and 1 (3x4 each), attached.
        ranks = [pb.RankChunks(rank=r, local_elements=12, chunks=[pb.Chunk(
            box=pb.Box(offset=[3 * r, 0], shape=[3, 4]))]) for r in range(2)]
        return pb.TensorInfo(name="lent", shape=[6, 4], dtype=pb.F32, spec="S(0)", version=4,
                             attached=True, unattached_ranks=[0, 1],
                             layout=pb.Layout(global_shape=[6, 4], ranks=ranks))

    def Redistribute(self, request, context):
        self.requests["redistribute"] = request
        state = pb.ABORTED if self.abort else pb.COMMITTED
        return pb.RedistributeResponse(progress=pb.PlanProgress(
            plan_id="p1", state=state, error="rank 3 died" if self.abort else ""))

    def Gather(self, request, context):
        self.requests["gather"] = request
        return pb.RedistributeResponse(progress=pb.PlanProgress(plan_id="p2", state=pb.COMMITTED))

    def Copy(self, request, context):
        self.requests["copy"] = request
        state = pb.ABORTED if self.abort else pb.COMMITTED
        return pb.CopyResponse(progress=pb.PlanProgress(
            plan_id="p3", state=state, error="rank 3 died" if self.abort else ""), dst_version=9)

    def CopyGroup(self, request, context):
        self.requests["copy_group"] = request
        if self.abort:
            context.abort(grpc.StatusCode.ABORTED, "group g-1 aborted: copies[1] failed")
        return pb.CopyGroupResponse(
            group_id="g-1", state=pb.COMMITTED, bytes_moved=8, lower_bound_bytes=8,
            members=[pb.CopyGroupMember(src=c.src, dst=c.dst, dst_version=10 + i)
                     for i, c in enumerate(request.copies)])

    def RedistributeGroup(self, request, context):
        self.requests["redistribute_group"] = request
        return pb.RedistributeGroupResponse(
            group_id="g-2", state=pb.COMMITTED,
            members=[pb.RedistributeGroupMember(tensor=r.tensor, version=20 + i)
                     for i, r in enumerate(request.redistributes)])

    def GatherGroup(self, request, context):
        self.requests["gather_group"] = request
        return pb.RedistributeGroupResponse(
            group_id="g-3", state=pb.COMMITTED, buckets=1, bucket_bytes=1 << 20,
            members=[pb.RedistributeGroupMember(tensor=t, version=30 + i)
                     for i, t in enumerate(request.tensors)])

    def CreateTransfer(self, request, context):
        self.requests["create_transfer"] = request
        return pb.TransferInfo(name=request.name, members=len(request.copies), prepared=True,
                               participants=8)

    def RunTransfer(self, request, context):
        self.requests["run_transfer"] = request
        if self.abort:
            context.abort(grpc.StatusCode.ABORTED, "run t-1 of transfer 'sync' aborted: rank 3")
        return pb.RunTransferResponse(name=request.name, run_id="t-1", state=pb.COMMITTED,
                                      seconds=0.5, bytes_moved=64, lower_bound_bytes=32,
                                      members=2, replanned=True, version=7)

    def GetTransfer(self, request, context):
        self.requests["get_transfer"] = request
        return pb.TransferInfo(name=request.name, members=1,
                               copies=[pb.CopyPair(src="a", dst="b")] if request.copies else [])

    def ListTransfers(self, request, context):
        # 1,500 transfers x0000..x1499 in pages of 1,000.
        names = [f"x{i:04d}" for i in range(1500)]
        start = names.index(request.page_token) + 1 if request.page_token else 0
        page = names[start:start + 1000]
        more = start + 1000 < len(names)
        return pb.ListTransfersResponse(transfers=[pb.TransferInfo(name=n) for n in page],
                                        next_page_token=page[-1] if more else "")

    def DeleteTransfer(self, request, context):
        self.requests["delete_transfer"] = request
        return pb.DeleteTransferResponse()

    def Download(self, request, context):
        data = np.arange(12, dtype="<f4").tobytes()
        yield pb.TensorData(header=pb.TensorHeader(name=request.name, shape=[3, 4], dtype=pb.F32,
                                                   total_bytes=len(data)))
        yield pb.TensorData(data=data[:20])
        yield pb.TensorData(data=data[20:])

    def Upload(self, request_iterator, context):
        self.upload_messages = list(request_iterator)
        header = self.upload_messages[0].header
        return pb.UploadResponse(tensor=pb.TensorInfo(name=header.name, shape=header.shape,
                                                      dtype=header.dtype))


def serve(test, servicer):
    """Serves `servicer` (a Coordinator servicer) on a free loopback port until `test` ends
    (stopped after its tearDown); returns its address."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    test.addCleanup(server.stop, None)
    return f"127.0.0.1:{port}"


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeCoordinator()
        self.address = serve(self, self.fake)
        self.client = sc.Client(self.address, timeout=30)

    def tearDown(self):
        self.client.close()

    def test_workers(self):
        workers = self.client.workers()
        self.assertEqual([w.name for w in workers], ["w0", "w1"])
        self.assertEqual(workers[0].local_socket, "/nonexistent/w0.sock")

    def test_token_is_sent_as_bearer_metadata(self):
        self.assertNotIn("authorization", self.fake.requests.get("metadata", {}))
        self.client.workers()
        self.assertNotIn("authorization", self.fake.requests["metadata"])
        self.fake.required_token = "s3cret"
        with sc.connect(self.address, token="s3cret") as c:
            c.workers()
        self.assertEqual(self.fake.requests["metadata"]["authorization"], "Bearer s3cret")
        with sc.connect(self.address, token="nope") as c:
            with self.assertRaises(sc.Error) as e:
                c.workers()
        self.assertEqual(e.exception.code, "UNAUTHENTICATED")

    def test_token_from_the_environment(self):
        self.fake.required_token = "from-env"
        with mock.patch.dict(os.environ, {"SHARDCOORD_TOKEN": "from-env"}):
            with sc.connect(self.address) as c:
                c.workers()
        self.assertEqual(self.fake.requests["metadata"]["authorization"], "Bearer from-env")

    def test_unavailable_is_retried_with_one_request_id(self):
        self.fake.unavailable_mesh_creates = 2
        info = self.client.create_mesh("m", [2, 2])
        self.assertEqual(info.name, "m")
        ids = [r.request_id for r in self.fake.requests["create_mesh"]]
        self.assertEqual(len(ids), 3)
        self.assertEqual(len(ids[0]), 32)
        self.assertEqual(set(ids), {ids[0]})
        self.client.create_mesh("m", [2, 2])
        self.assertNotEqual(self.fake.requests["create_mesh"][3].request_id, ids[0])
        self.fake.requests["create_mesh"] = []
        with sc.Client(self.address, retry_for=0) as once:
            with self.assertRaises(sc.Error) as e:
                once.create_mesh("m", [2, 2])
        self.assertEqual((e.exception.code, e.exception.message), ("UNAVAILABLE", "recovering"))

    def test_create_tensor_request(self):
        t = self.client.create_tensor("t", shape=[64, 48], mesh="m", placements="S(0),R",
                                      init="arange", seed=3)
        self.assertEqual(list(t.shape), [64, 48])
        r = self.fake.requests["create"]
        self.assertEqual(r.spec.mesh, "m")
        self.assertEqual(r.spec.placements_text, "S(0),R")
        self.assertEqual(r.dtype, pb.F32)
        self.assertEqual(r.init, pb.ARANGE)
        self.assertEqual(r.seed, 3)
        with self.assertRaises(ValueError):
            self.client.create_tensor("t", [4], mesh="m", placements="R", flat="0:4")
        self.client.create_tensor("f", [8, 512], dtype="bf16", mesh="m", init="attached",
                                  flat=[[(0, 4096)], [(4096, 4100), (4200, 4300)], []])
        r = self.fake.requests["create"]
        self.assertEqual((r.init, r.dtype), (pb.ATTACHED, pb.BF16))
        self.assertEqual(r.spec.flat_text, "0:4096;4096:4100,4200:4300;")

    def test_create_tensors_is_one_call(self):
        made = self.client.create_tensors([
            dict(name="a", shape=[4, 4], mesh="m", placements="S(0)", init="arange"),
            dict(name="b", shape=[8], dtype="bf16", mesh="m", flat="0:4;4:8", init="attached")])
        self.assertEqual(made, {"created": 2, "bytes": 64})
        r = self.fake.requests["create_many"]
        self.assertEqual([t.name for t in r.tensors], ["a", "b"])
        self.assertEqual(r.tensors[0].init, pb.ARANGE)
        self.assertEqual((r.tensors[1].dtype, r.tensors[1].spec.flat_text), (pb.BF16, "0:4;4:8"))
        self.assertTrue(r.request_id)
        with self.assertRaisesRegex(ValueError, r"tensors\[1\]: dtype: 'f99'"):
            self.client.create_tensors([dict(name="a", shape=[4], mesh="m", placements="R"),
                                        dict(name="b", shape=[4], dtype="f99", mesh="m",
                                             placements="R")])

    def test_register_a_model_in_one_call(self):
        shapes = {"model.layers.0.self_attn.q_proj.weight": [8, 4],
                  "model.layers.0.self_attn.o_proj.weight": [4, 8],
                  "model.norm.weight": [4]}
        self.assertEqual(self.client.register(shapes, "train", "fsdp_flat")["created"], 3)
        r = self.fake.requests["create_many"]
        self.assertEqual([t.spec.flat_text for t in r.tensors],
                         layouts.fsdp_flat(list(shapes.values()), 4))
        self.assertEqual({(t.init, t.dtype, t.spec.mesh) for t in r.tensors},
                         {(pb.ATTACHED, pb.BF16, "train")})
        self.client.register(shapes, "infer", "megatron_tp", dtype="f32", init="zeros")
        r = self.fake.requests["create_many"]
        self.assertEqual([t.spec.placements_text for t in r.tensors], ["R,S(0)", "R,S(1)", "R,R"])
        self.client.register(list(shapes.items())[:1], "train", lambda n, s: {"placements": "R"})
        self.assertEqual(self.fake.requests["create_many"].tensors[0].spec.placements_text, "R")
        with self.assertRaisesRegex(ValueError, "layout: no spec for 'model.norm.weight'"):
            self.client.register(shapes, "train", {k: {"placements": "R"}
                                                   for k in list(shapes)[:2]})
        with self.assertRaises(sc.Error) as e:
            self.client.register(shapes, "nope", "fsdp_flat")
        self.assertEqual(e.exception.code, "NOT_FOUND")

    def test_delete_tensors(self):
        self.assertEqual(self.client.delete_tensors(["x", "y"], prefix="layers."), 4)
        r = self.fake.requests["delete_many"]
        self.assertEqual((list(r.names), r.prefix), (["x", "y"], "layers."))

    def test_tensors_pages_through_every_tensor(self):
        names = [t.name for t in self.client.tensors()]
        self.assertEqual(len(names), 2500)
        self.assertEqual(names[-1], "t02499")
        self.assertEqual(len(self.fake.requests["list"]), 3)
        self.assertEqual([t.name for t in self.client.list_tensors(prefix="t0001")],
                         [f"t{i:05d}" for i in range(10, 20)])

    def test_local_buffers_of_an_attached_tensor(self):
        self.assertEqual(self.client.local_nbytes("lent", 1), 48)
        self.assertEqual(self.client.local_shape("lent", 0), (3, 4))
        buf = self.client.alloc("lent", 1)
        self.assertEqual((buf.shape, buf.dtype), ((3, 4), np.float32))
        self.assertFalse(buf.any())
        with self.assertRaises(sc.Error) as e:
            self.client.local_nbytes("lent", 7)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")

    def test_attach_refuses_a_wrong_buffer_before_it_reaches_a_worker(self):
        # The workers' sockets do not exist: a refusal that reached one would be UNAVAILABLE.
        cases = {
            "non-contiguous": np.zeros((4, 3), np.float32).T,
            "type": [0.0] * 12,
        }
        for label, buf in cases.items():
            with self.subTest(label):
                with self.assertRaises(sc.Error) as e:
                    self.client.attach("lent", 0, buf)
                self.assertEqual(e.exception.code, "INVALID_ARGUMENT", e.exception.message)
                self.assertEqual(e.exception.member, "lent")
        # Size and dtype are the worker's to check against the layout (bulk attach looks no
        # tensor up): they reach the socket.
        with self.assertRaises(sc.Error) as e:
            self.client.attach("lent", 0, np.zeros((3, 3), np.float64))
        self.assertEqual(e.exception.code, "UNAVAILABLE")
        with self.assertRaises(sc.Error) as e:  # Rank 1's worker keeps its buffers on a GPU.
            self.client.attach("lent", 1, np.zeros((3, 4), np.float32))
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("cuda:0", e.exception.message)
        with self.assertRaises(sc.Error) as e:  # A right buffer does try the socket.
            self.client.attach("lent", 0, np.zeros((3, 4), np.float32))
        self.assertEqual(e.exception.code, "UNAVAILABLE")
        self.assertIn("/nonexistent/w0.sock", e.exception.message)

    def test_cuda_ipc_handles_of_every_torch_layout(self):
        from shardcoord._buffers import cuda_ipc_handle  # pylint: disable=import-outside-toplevel
        handle = bytes(range(64))
        self.assertEqual(cuda_ipc_handle(handle), handle)  # torch < 2.2: the bare handle
        for version in (1, 2, 3):  # then a version byte and the block's type
            self.assertEqual(cuda_ipc_handle(bytes([version]) + b"c" + handle), handle)
        for bad, words in ((b"\x02e" + bytes(40), "expandable_segments:False"),
                           (b"\x02c" + bytes(10), "12 bytes"), (b"", "0 bytes")):
            with self.assertRaises(sc.Error) as e:
                cuda_ipc_handle(bad)
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.assertIn(words, e.exception.message)

    def test_errors_keep_code_and_message(self):
        with self.assertRaises(sc.Error) as e:
            self.client._call(self.client._stub.GetTensor, pb.GetTensorRequest(name="x"), 30)
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertEqual(e.exception.message, "tensor 'x' does not exist")

    def test_redistribute_and_gather(self):
        self.client.redistribute("t", placements="R,S(1)", mesh="m2")
        r = self.fake.requests["redistribute"]
        self.assertTrue(r.wait)
        self.assertEqual(r.target.mesh, "m2")
        self.assertEqual(r.target.placements_text, "R,S(1)")
        self.client.gather("t", to_rank=2)
        g = self.fake.requests["gather"]
        self.assertTrue(g.has_to_rank)
        self.assertEqual(g.to_rank, 2)
        self.fake.abort = True
        with self.assertRaises(sc.Error) as e:
            self.client.redistribute("t", flat="0:6;6:12")
        self.assertEqual(e.exception.code, "ABORTED")
        self.assertIn("rank 3 died", e.exception.message)

    def test_copy(self):
        r = self.client.copy("a", "b")
        self.assertEqual(r.dst_version, 9)
        c = self.fake.requests["copy"]
        self.assertEqual((c.src, c.dst, c.wait), ("a", "b", True))
        self.assertEqual((c.quantize, c.dequantize, c.scale), ("", False, ""))
        self.client.copy("w", "q", quantize="block:128x128", scale="q_scale")
        c = self.fake.requests["copy"]
        self.assertEqual((c.quantize, c.dequantize, c.scale), ("block:128x128", False, "q_scale"))
        self.client.copy("q", "y", dequantize=True, scale="q_scale")
        c = self.fake.requests["copy"]
        self.assertEqual((c.quantize, c.dequantize, c.scale), ("", True, "q_scale"))
        self.fake.abort = True
        with self.assertRaises(sc.Error) as e:
            self.client.copy("a", "b")
        self.assertEqual(e.exception.code, "ABORTED")

    def test_copy_many(self):
        r = self.client.copy_many([("a", "a_infer"), {"src": "b", "dst": "b_infer"}])
        self.assertEqual(r.group_id, "g-1")
        self.assertEqual([m.dst_version for m in r.members], [10, 11])
        c = self.fake.requests["copy_group"]
        self.assertTrue(c.wait)
        self.assertEqual([(p.src, p.dst) for p in c.copies],
                         [("a", "a_infer"), ("b", "b_infer")])
        self.assertEqual(list(c.copies[1].dst_offset), [])
        # Slices of fused tensors: boxes in dicts, and in a single copy.
        self.client.copy_many([{"src": "k", "dst": "qkv", "dst_offset": [64, 0]},
                               {"src": "qkv", "dst": "v", "src_offset": [80, 0],
                                "src_shape": [16, 32]}])
        c = self.fake.requests["copy_group"]
        self.assertEqual(list(c.copies[0].dst_offset), [64, 0])
        self.assertEqual((list(c.copies[1].src_offset), list(c.copies[1].src_shape)),
                         ([80, 0], [16, 32]))
        self.client.copy("k", "qkv", dst_offset=[64, 0])
        self.assertEqual(list(self.fake.requests["copy"].dst_offset), [64, 0])
        # Block-scaled FP8 members.
        self.client.copy_many([{"src": "w", "dst": "wq", "quantize": "block:128x128",
                                "scale": "ws"},
                               {"src": "wq2", "dst": "w2", "dequantize": True, "scale": "ws2"}])
        c = self.fake.requests["copy_group"]
        self.assertEqual((c.copies[0].quantize, c.copies[0].dequantize, c.copies[0].scale),
                         ("block:128x128", False, "ws"))
        self.assertEqual((c.copies[1].quantize, c.copies[1].dequantize, c.copies[1].scale),
                         ("", True, "ws2"))
        self.fake.abort = True
        with self.assertRaises(sc.Error) as e:
            self.client.copy_many([("a", "a_infer")])
        self.assertEqual(e.exception.code, "ABORTED")
        self.assertIn("copies[1]", str(e.exception))

    def test_prepared_transfers(self):
        info = self.client.create_transfer("sync", [("a", "a_infer"), {"src": "b", "dst": "b_i"}])
        self.assertEqual((info.members, info.participants), (2, 8))
        c = self.fake.requests["create_transfer"]
        self.assertEqual(c.name, "sync")
        self.assertEqual([(p.src, p.dst) for p in c.copies], [("a", "a_infer"), ("b", "b_i")])
        self.assertTrue(c.request_id)  # Retries replay instead of creating twice.
        run = self.client.run("sync")
        self.assertEqual(run, {"name": "sync", "seconds": 0.5, "bytes_moved": 64,
                               "lower_bound_bytes": 32, "members": 2, "replanned": True,
                               "version": 7, "run_id": "t-1", "prepare_seconds": 0.0})
        self.assertTrue(self.fake.requests["run_transfer"].wait)
        self.assertEqual(len(self.client.transfers()), 1500)
        self.assertEqual([(p.src, p.dst) for p in self.client.transfer_info("sync", copies=True).copies],
                         [("a", "b")])
        self.client.delete_transfer("sync")
        self.assertEqual(self.fake.requests["delete_transfer"].name, "sync")
        self.fake.abort = True
        with self.assertRaises(sc.Error) as e:
            self.client.run_transfer("sync")
        self.assertEqual(e.exception.code, "ABORTED")
        self.assertIn("rank 3", str(e.exception))

    def test_redistribute_many(self):
        r = self.client.redistribute_many([("a", "S(1)"),
                                           {"tensor": "b", "placements": "R", "mesh": "m"}])
        self.assertEqual(r.group_id, "g-2")
        self.assertEqual([m.version for m in r.members], [20, 21])
        req = self.fake.requests["redistribute_group"]
        self.assertTrue(req.wait)
        self.assertEqual([i.tensor for i in req.redistributes], ["a", "b"])
        self.assertEqual(req.redistributes[0].target.placements_text, "S(1)")
        self.assertEqual(req.redistributes[1].target.mesh, "m")
        self.client.redistribute_many({"a": {"placements": "S(1)"}, "b": {"flat": "0:4;4:8"}})
        req = self.fake.requests["redistribute_group"]
        self.assertEqual([(i.tensor, i.target.placements_text, i.target.flat_text)
                          for i in req.redistributes], [("a", "S(1)", ""), ("b", "", "0:4;4:8")])

    def test_gather_many_is_one_group(self):
        r = self.client.gather_many(["a", "b"], to_rank=2)
        self.assertEqual((r.group_id, r.buckets), ("g-3", 1))
        self.assertEqual([m.version for m in r.members], [30, 31])
        req = self.fake.requests["gather_group"]
        self.assertEqual((list(req.tensors), req.has_to_rank, req.to_rank, req.wait),
                         (["a", "b"], True, 2, True))
        # gather() of a list is the same group; of one name, a plain Gather.
        self.client.gather(["c", "d"], mesh="m")
        req = self.fake.requests["gather_group"]
        self.assertEqual((list(req.tensors), req.mesh, req.has_to_rank), (["c", "d"], "m", False))
        self.client.gather("e")
        self.assertEqual(self.fake.requests["gather"].tensor, "e")

    def test_download_is_a_numpy_array(self):
        a = self.client.download("t")
        self.assertEqual(a.shape, (3, 4))
        self.assertEqual(a.dtype, np.float32)
        np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4))

    def test_upload_streams_at_most_one_mib(self):
        a = np.arange(600_000, dtype=np.int32).reshape(1000, 600)  # 2.4 MB
        info = self.client.upload("u", a, mesh="m", placements="S(1)")
        self.assertEqual(list(info.shape), [1000, 600])
        messages = self.fake.upload_messages
        self.assertEqual(messages[0].header.dtype, pb.I32)
        self.assertEqual(messages[0].header.total_bytes, a.nbytes)
        self.assertEqual(messages[0].data, b"")
        self.assertTrue(all(len(m.data) <= 1 << 20 for m in messages[1:]))
        self.assertEqual(b"".join(m.data for m in messages[1:]), a.tobytes())


class FakeWorkerSocket:
    """A worker's local socket that records each LocalRequest with the descriptors that came
    with it (gathered over as many recvmsg calls as the frame takes) and answers `answer`."""

    def __init__(self, path, answer):
        self.path = path
        self.answer = answer  # LocalRequest -> LocalResponse
        self.requests = []    # (LocalRequest, [os.fstat of each descriptor])
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        conn, _ = self._listener.accept()
        with conn:
            data, fds = b"", []
            while True:
                chunk, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * 253))
                if not chunk:
                    return
                for level, kind, payload in ancillary:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds += array.array("i", payload[:len(payload) - len(payload) % 4])
                data += chunk
                if len(data) < 4 or len(data) < 4 + struct.unpack("<I", data[:4])[0]:
                    continue
                n = struct.unpack("<I", data[:4])[0]
                request = pb.LocalRequest.FromString(data[4:4 + n])
                data = data[4 + n:]
                self.requests.append((request, [os.fstat(fd) for fd in fds]))
                for fd in fds:
                    os.close(fd)
                fds = []
                reply = self.answer(request).SerializeToString()
                conn.sendall(struct.pack("<I", len(reply)) + reply)

    def close(self):
        self._listener.close()


class AttachManyTest(unittest.TestCase):
    """attach_many / lend / receive against a scripted coordinator and worker socket: one
    local request for every buffer, no tensor looked up, one ListWorkers per client."""

    def setUp(self):
        self.fake = FakeCoordinator()
        address = serve(self, self.fake)
        self.dir = tempfile.mkdtemp(prefix="sc-", dir="/tmp")
        self.fake.sockets[0] = os.path.join(self.dir, "w0.sock")
        self.refuse = None

        def answer(request):
            if self.refuse:
                return pb.LocalResponse(code=3, message=self.refuse)  # INVALID_ARGUMENT
            many = request.attach_many
            return pb.LocalResponse(attach_many=pb.LocalAttachManyResponse(attachments=[
                pb.LocalAttachResponse(worker="w0", memory="x", readable=i % 2 == 0)
                for i in range(len(many.attachments))]))

        self.worker = FakeWorkerSocket(self.fake.sockets[0], answer)
        self.client = sc.Client(address, timeout=30)

    def tearDown(self):
        self.client.close()
        self.worker.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_one_request_carries_every_buffer_and_no_tensor_is_looked_up(self):
        from shardcoord._buffers import alloc_shared  # pylint: disable=import-outside-toplevel
        shared = alloc_shared(4 * 300, "f32", (300,), "numpy")  # One memfd, three buffers in it.
        other = alloc_shared(64, "f32", (16,), "numpy")
        state = {"a": np.zeros(5, np.float32), "b": shared[:100], "c": shared[100:250],
                 "d": np.zeros(0, np.int64), "e": other, "f": shared[250:],
                 "g": np.zeros(3, np.uint16)}  # bf16 bits.
        got = self.client.lend(0, state)
        self.assertEqual(got, {n: i % 2 == 0 for i, n in enumerate(state)})
        self.assertEqual(len(self.worker.requests), 1)
        request, fds = self.worker.requests[0]
        many = request.attach_many.attachments
        self.assertEqual([a.tensor for a in many], list(state))
        self.assertTrue(all(a.rank == 0 and a.version == 0 and not a.HasField("chunks")
                            for a in many))
        self.assertEqual([a.bytes for a in many], [20, 400, 600, 0, 64, 200, 6])
        self.assertEqual([a.WhichOneof("memory") for a in many],
                         ["process", "shared", "shared", "process", "shared", "shared",
                          "process"])
        self.assertEqual([a.dtype for a in many],
                         [pb.F32, pb.F32, pb.F32, pb.I64, pb.F32, pb.F32, pb.BF16])
        # Two descriptors: the three slices of one memfd share the first, at their offsets.
        self.assertEqual(len(fds), 2)
        self.assertEqual([(many[i].shared.fd_index, many[i].shared.offset) for i in (1, 2, 5)],
                         [(0, 0), (0, 400), (0, 1000)])
        self.assertEqual(many[4].shared.fd_index, 1)
        self.assertNotEqual(fds[0].st_ino, fds[1].st_ino)
        # One ListWorkers for the client, no GetTensor: a second call lists nothing.
        self.assertEqual(self.client.attach("h", 0, np.zeros(2, np.float32)), True)
        self.assertEqual(self.fake.requests["list_workers"], 1)
        self.assertEqual(len(self.worker.requests), 2)

    def test_a_refusal_names_the_member_and_receive_wants_writable_buffers(self):
        self.refuse = "attachments[1] 'b': bytes: the buffer has 8 bytes but rank 0's chunks ..."
        with self.assertRaises(sc.Error) as e:
            self.client.attach_many(0, [("a", np.zeros(2, np.float32)),
                                        ("b", np.zeros(2, np.float32))])
        self.assertEqual((e.exception.code, e.exception.member), ("INVALID_ARGUMENT", "b"))
        frozen = np.zeros(2, np.float32)
        frozen.flags.writeable = False
        with self.assertRaises(sc.Error) as e:
            self.client.receive(0, {"a": np.zeros(2, np.float32), "b": frozen})
        self.assertEqual(e.exception.member, "b")
        self.assertEqual(len(self.worker.requests), 1)  # Refused before it was sent.
        with self.assertRaises(sc.Error) as e:  # Rank 1's worker keeps its buffers on a GPU.
            self.client.lend(1, {"a": np.zeros(2, np.float32)})
        self.assertEqual((e.exception.code, e.exception.member), ("INVALID_ARGUMENT", "a"))
        with self.assertRaises(ValueError):
            self.client.lend(0, {})

    def test_progress_is_text_on_a_terminal_and_silent_otherwise(self):
        from shardcoord import _progress  # pylint: disable=import-outside-toplevel

        class Terminal(io.StringIO):
            def isatty(self):
                return True

        tty, pipe = Terminal(), io.StringIO()
        for stream in (tty, pipe):
            bar = _progress.Progress("lend rank 0", 3, stream=stream)
            for i in range(1, 4):
                bar.update(i, "described")
            bar.close("3 buffers lent")
        self.assertIn("3/3 buffers described", tty.getvalue())
        self.assertIn("lend rank 0: 3 buffers lent in ", tty.getvalue())
        self.assertEqual(pipe.getvalue(), "")


class OldModuleTest(unittest.TestCase):
    """shardcoord_client keeps its names and create_tensor's argument order."""

    def test_old_names_over_the_package(self):
        fake = FakeCoordinator()
        with shardcoord_client.connect(serve(self, fake)) as c:
            self.assertIsInstance(c, shardcoord_client.ShardcoordClient)
            c.create_tensor("t", "m", [64, 48], placements="S(0),R", init="arange")
            self.assertEqual(fake.requests["create"].spec.mesh, "m")
            self.assertEqual(list(fake.requests["create"].shape), [64, 48])
            self.assertEqual([w.name for w in c.list_workers()], ["w0", "w1"])
            with self.assertRaises(shardcoord_client.ShardcoordError):
                c.tensor("nothing")


class Standby(pb_grpc.CoordinatorServicer):
    """A coordinator that does not lead: every call UNAVAILABLE naming `leader` (as the
    daemon's StandbyService does), counted."""

    def __init__(self, leader):
        self.leader = leader
        self.calls = 0

    def _refuse(self, context):
        self.calls += 1
        if self.leader:
            context.set_trailing_metadata(((sc.LEADER_METADATA, self.leader),))
        context.abort(grpc.StatusCode.UNAVAILABLE, f"standby; the leader is {self.leader}")

    def CreateMesh(self, request, context):
        self._refuse(context)

    def ListWorkers(self, request, context):
        self._refuse(context)

    def Download(self, request, context):
        self._refuse(context)
        yield pb.TensorData()


class LeaderTest(unittest.TestCase):
    """Several coordinators ("A,B"): calls follow the leader a standby names."""

    def setUp(self):
        self.fake = FakeCoordinator()
        self.leader = serve(self, self.fake)
        self.standby = Standby(self.leader)
        self.standby_address = serve(self, self.standby)

    def test_a_change_follows_the_hint_with_one_request_id(self):
        with sc.connect(f"{self.standby_address}, {self.leader}", retry_for=30) as c:
            self.assertEqual(c.create_mesh("m", [2]).name, "m")
            self.assertEqual(self.standby.calls, 1)
            self.assertEqual(len(self.fake.requests["create_mesh"]), 1)
            self.assertEqual(len(self.fake.requests["create_mesh"][0].request_id), 32)
            self.assertEqual([w.name for w in c.workers()], ["w0", "w1"])
            self.assertEqual(self.standby.calls, 1)  # The next call went to the leader.

    def test_a_leader_outside_the_list_and_a_refused_stream(self):
        with sc.connect(self.standby_address, retry_for=30) as c:
            self.assertEqual(c.download("t").shape, (3, 4))  # Followed to the leader at once.
            self.assertEqual(self.standby.calls, 1)
        with sc.connect(self.standby_address, retry_for=0) as c:
            with self.assertRaises(sc.Error) as e:
                c.download("t")  # Without retries refused...
            self.assertEqual(e.exception.code, "UNAVAILABLE")
            self.assertEqual(c.download("t").shape, (3, 4))  # ...but the next call moves on.

    def test_no_leader_and_no_retry_is_unavailable(self):
        self.standby.leader = ""
        with sc.connect(self.standby_address, retry_for=0) as c:
            with self.assertRaises(sc.Error) as e:
                c.workers()
        self.assertEqual(e.exception.code, "UNAVAILABLE")


class Breaking(pb_grpc.CoordinatorServicer):
    """A coordinator whose streams break: Download sends `data` of `version` in slices of
    `slice` bytes and, with `fail_after` set, aborts with `code` once that many bytes are out;
    Upload takes the data and, with `fail_after` set, aborts with `code` once it took that
    many. Records each upload's request_id and data."""

    def __init__(self, data=b"", version=7, slice=5, fail_after=None,
                 code=grpc.StatusCode.UNAVAILABLE):
        self.data, self.version, self.slice = data, version, slice
        self.fail_after, self.code = fail_after, code
        self.calls = 0
        self.uploads = []

    def Download(self, request, context):
        self.calls += 1
        yield pb.TensorData(header=pb.TensorHeader(
            name=request.name, shape=[len(self.data)], dtype=pb.U8,
            total_bytes=len(self.data), version=self.version))
        for off in range(0, len(self.data), self.slice):
            if self.fail_after is not None and off >= self.fail_after:
                context.abort(self.code, "scripted failure")
            yield pb.TensorData(data=self.data[off:off + self.slice])
        if self.fail_after is not None:
            context.abort(self.code, "scripted failure")

    def Upload(self, request_iterator, context):
        self.calls += 1
        header, data = None, b""
        for message in request_iterator:
            if header is None:
                header = message.header
                continue
            data += message.data
            if self.fail_after is not None and len(data) >= self.fail_after:
                self.uploads.append((header.request_id, data))
                context.abort(self.code, "scripted failure")
        self.uploads.append((header.request_id, data))
        return pb.UploadResponse(tensor=pb.TensorInfo(name=header.name, shape=header.shape,
                                                      dtype=header.dtype, version=self.version))


PATTERN = bytes(i % 251 for i in range(1000))


class StreamFailoverTest(unittest.TestCase):
    """Streams broken on A (UNAVAILABLE) are resumed or restarted on B."""

    def test_a_download_broken_midway_resumes_without_duplicated_bytes(self):
        a = Breaking(PATTERN, slice=37, fail_after=333)
        b = Breaking(PATTERN, slice=50)
        with sc.connect(f"{serve(self, a)},{serve(self, b)}", retry_for=30) as c:
            got = c.download("t")
        self.assertEqual(got.tobytes(), PATTERN)
        self.assertEqual((a.calls, b.calls), (1, 1))

    def test_a_download_does_not_resume_on_another_version(self):
        a = Breaking(PATTERN, version=7, slice=40, fail_after=120)
        b = Breaking(PATTERN, version=8)
        with sc.connect(f"{serve(self, a)},{serve(self, b)}", retry_for=30) as c:
            with self.assertRaises(sc.Error) as e:
                c.download("t")
        self.assertEqual(e.exception.code, "ABORTED")
        self.assertIn("from version 7 to 8", str(e.exception))

    def test_a_download_that_fails_otherwise_after_data_moved_is_not_retried(self):
        for code in (grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL):
            a = Breaking(PATTERN, slice=40, fail_after=80, code=code)
            b = Breaking(PATTERN)
            with sc.connect(f"{serve(self, a)},{serve(self, b)}", retry_for=30) as c:
                with self.assertRaises(sc.Error) as e:
                    c.download("t")
            self.assertEqual(e.exception.code, code.name)
            self.assertEqual(b.calls, 0)

    def test_an_upload_broken_midway_is_sent_again_whole_with_one_request_id(self):
        array = np.arange(3 * (1 << 18), dtype="<i4")  # 3 MiB: three data messages.
        a = Breaking(fail_after=1 << 20)
        b = Breaking(version=9)
        with sc.connect(f"{serve(self, a)},{serve(self, b)}", retry_for=30) as c:
            info = c.upload("u", array, mesh="m", placements="R")
        self.assertEqual(info.version, 9)
        self.assertEqual(len(a.uploads), 1)
        self.assertEqual(len(b.uploads), 1)
        self.assertLess(len(a.uploads[0][1]), array.nbytes)
        self.assertEqual(b.uploads[0][1], array.tobytes())  # From the first byte, all of it.
        self.assertEqual(len(a.uploads[0][0]), 32)
        self.assertEqual(a.uploads[0][0], b.uploads[0][0])


def _make_certs():
    """Certificates from tools/dev_certs.sh (the first argument), or None without it."""
    if len(sys.argv) < 2:
        return None
    out = os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(), "certs")
    subprocess.run(["bash", sys.argv[1], out, "w0"], check=True, stdout=subprocess.DEVNULL)
    return out


CERTS = _make_certs()


def read(name):
    with open(os.path.join(CERTS, name), "rb") as f:
        return f.read()


@unittest.skipUnless(CERTS, "no certificates (pass tools/dev_certs.sh as the first argument)")
class TlsTest(unittest.TestCase):
    """The fake servicer behind TLS with the dev coordinator certificate (SAN 127.0.0.1)."""

    def setUp(self):
        self.fake = FakeCoordinator()
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_CoordinatorServicer_to_server(self.fake, self.server)
        credentials = grpc.ssl_server_credentials(
            [(read("coordinator.key"), read("coordinator.pem"))],
            root_certificates=read("ca.pem"), require_client_auth=True)
        port = self.server.add_secure_port("127.0.0.1:0", credentials)
        self.server.start()
        self.address = f"127.0.0.1:{port}"

    def tearDown(self):
        self.server.stop(None)

    def test_tls_with_client_certificate(self):
        with sc.connect(self.address, tls_ca=os.path.join(CERTS, "ca.pem"),
                        tls_cert=os.path.join(CERTS, "client.pem"),
                        tls_key=os.path.join(CERTS, "client.key"), timeout=10) as c:
            self.assertEqual([w.name for w in c.workers()], ["w0", "w1"])

    def test_ca_from_the_environment(self):
        with mock.patch.dict(os.environ, {"SHARDCOORD_TLS_CA": os.path.join(CERTS, "ca.pem")}):
            with sc.connect(self.address, tls_cert=os.path.join(CERTS, "client.pem"),
                            tls_key=os.path.join(CERTS, "client.key"), timeout=10) as c:
                c.workers()

    def test_refused_without_the_right_tls(self):
        cases = {
            "plaintext": {},
            "no client certificate": {"tls_ca": os.path.join(CERTS, "ca.pem")},
            "another CA": {"tls_ca": os.path.join(CERTS, "other-ca.pem"),
                           "tls_cert": os.path.join(CERTS, "client.pem"),
                           "tls_key": os.path.join(CERTS, "client.key")},
        }
        for label, kwargs in cases.items():
            with self.subTest(label):
                with sc.connect(self.address, timeout=10, retry_for=0, **kwargs) as c:
                    with self.assertRaises(sc.Error) as e:
                        c.workers()
                self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_bad_arguments_name_argument_and_path(self):
        with self.assertRaisesRegex(ValueError, "tls_ca: cannot read /nonexistent.pem"):
            sc.connect(self.address, tls_ca="/nonexistent.pem")
        with self.assertRaisesRegex(ValueError, "tls_cert and tls_key together"):
            sc.connect(self.address, tls_ca=os.path.join(CERTS, "ca.pem"),
                       tls_cert=os.path.join(CERTS, "client.pem"))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
