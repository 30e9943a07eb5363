"""--check: GPTQ weights with known values, repacked to Marlin, run through the backend against the fp32 torch
reference on the same inputs, eager and (with --timing graph) as a CUDA graph; exit 1 on a mismatch. Imports
nothing heavy at module level: the benchmark's parser is loaded on the controller, torch-free."""

CHECK_TOLERANCE = 2e-2       # ‖out − ref‖/‖ref‖ for bf16 activations and bf16 intermediates


def check(bench, gptq) -> int:
    import marlin_backends as mb
    import marlin_weights as mw
    from marlin_timing import capture_graph, rotation_sets, static_views
    a = bench.args
    reference = mb.TorchReference(bench.shape, gptq)
    rows = []
    for m in a.batch_sizes:
        with bench.events.phase("check", m=m):
            sets = rotation_sets(m, bench.shape, a.routing, a.zipf_skew, bench.dtype, bench.device,
                                 mw.generator("cpu", a.seed * 7919 + m), n_sets=2)
            statics = static_views(m, bench.statics)
            buffers = bench.backend.buffers(m)

            def call(statics=statics, buffers=buffers):  # this batch size's, bound now
                return bench.backend(statics.x, statics.topk_w, statics.topk_ids, buffers)

            row = {"m": m, "eager": compare(bench.torch, call, reference, sets, 0, statics, buffers)}
            if a.timing == "graph":
                graph, output = capture_graph(call)
                row["graph"] = compare(bench.torch, lambda graph=graph, output=output: (graph.replay(), output)[1],
                                       reference, sets, 1, statics, buffers)
                del graph, output
            row["ok"] = all(row[k]["ok"] for k in ("eager", "graph") if k in row)
        rows.append(row)
        bench.events.emit("check", **row)
    passed = all(r["ok"] for r in rows)
    bench.result["check"] = {"passed": passed, "tolerance": CHECK_TOLERANCE, "rows": rows,
                            "corrupt_scale_perm": a.corrupt_scale_perm,
                            "weights": "GPTQ, nibbles and scales from the seed, repacked to Marlin"}
    bench.result["memory"] = {"weight_bytes": bench.weights.nbytes()}
    return 0 if passed else 1

def compare(torch, call, reference, sets, j: int, statics, buffers: dict) -> dict:
    """Poison the outputs, run on rotation set j, compare with the fp32 reference on the same inputs."""
    sets.load(j, statics)
    for key in ("out", "c2"):              # an element the kernels never write stays NaN and fails
        if key in buffers:
            buffers[key].fill_(float("nan"))
    out = call().to(torch.float64)
    ref = reference.forward_fp32(statics.x, statics.topk_w, statics.topk_ids).to(torch.float64)
    finite = bool(torch.isfinite(out).all())
    rel = float((out - ref).norm() / ref.norm()) if finite else float("inf")
    return {"rel_err": rel, "finite": finite, "ok": finite and rel <= CHECK_TOLERANCE}
