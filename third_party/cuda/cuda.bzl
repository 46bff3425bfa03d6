"""cuda_library: compile .cu files with /usr/local/cuda/bin/nvcc into a cc_library.

nvcc only compiles (no GPU is needed), for sm_90a machine code plus compute_90a
PTX, so the objects run on Hopper and JIT on later parts. Headers of `deps`
(their CcInfo) are visible to nvcc, so .cu files include the same
__host__ __device__ headers as host code.

Each compile also keeps ptxas's resource report (registers, stack, spills per
kernel: `-Xptxas=-v`) as <name>_nvcc/<source>.ptxas.txt, in the output group
"ptxas" of the <name>_nvcc target, so tests can check register budgets
without a GPU.
"""

_NVCC = "/usr/local/cuda/bin/nvcc"

_NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_90a,code=compute_90a",
    "--expt-relaxed-constexpr",
    "-lineinfo",  # source lines for profilers (ncu); no effect on code
    # The default mode left the recurrence kernels' fatbins at 8-10 MB per
    # translation unit (16 MB of cubin and 16 MB of PTX); "size" packs them
    # into about 1.5 MB each (decompressed once per process when loaded).
    "--compress-mode=size",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "-Werror=all-warnings",
]

def _cuda_objects_impl(ctx):
    cc_infos = [d[CcInfo] for d in ctx.attr.deps if CcInfo in d]
    headers = depset(
        ctx.files.hdrs,
        transitive = [c.compilation_context.headers for c in cc_infos],
    )
    include_flags = ["-I.", "-I" + ctx.bin_dir.path, "-I" + ctx.genfiles_dir.path]
    for c in cc_infos:
        cx = c.compilation_context
        for inc in cx.includes.to_list() + cx.quote_includes.to_list():
            include_flags.append("-I" + inc)
        for inc in cx.system_includes.to_list():
            include_flags.append("-isystem" + inc)
        for d in cx.defines.to_list():
            include_flags.append("-D" + d)
    objects = []
    reports = []
    for src in ctx.files.srcs:
        obj = ctx.actions.declare_file(ctx.label.name + "/" + src.basename.replace(".cu", ".o"))
        report = ctx.actions.declare_file(
            ctx.label.name + "/" + src.basename.replace(".cu", ".ptxas.txt"),
        )
        args = ctx.actions.args()
        copts = ctx.attr.copts + ctx.attr.src_copts.get(src.basename, [])
        args.add_all(_NVCC_FLAGS + ["-Xptxas=-v"] + copts + include_flags)
        args.add("-c", src.path)
        args.add("-o", obj.path)
        # linux-sandbox gives every nvcc the same PID, and nvcc names its
        # temporaries /tmp/tmpxft_<pid>_*: parallel compiles would collide,
        # so each one gets a private TMPDIR. nvcc's stderr (ptxas's report,
        # and any diagnostics) goes to the report; on failure it is printed.
        ctx.actions.run_shell(
            command = ('r="$1"; shift; d=$(mktemp -d) && TMPDIR="$d" "$@" 2> "$r"; rc=$?; ' +
                       'rm -rf "$d"; [ $rc -eq 0 ] || cat "$r" >&2; exit $rc'),
            arguments = [report.path, _NVCC, args],
            inputs = depset([src], transitive = [headers]),
            outputs = [obj, report],
            mnemonic = "NvccCompile",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        objects.append(obj)
        reports.append(report)
    return [DefaultInfo(files = depset(objects)), OutputGroupInfo(ptxas = depset(reports))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(),
        "copts": attr.string_list(),
        "src_copts": attr.string_list_dict(),
    },
)

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], src_copts = {}, visibility = None,
                 **kwargs):
    """A cc_library whose objects come from nvcc.

    Args:
      name: target name; link it like any cc_library.
      srcs: .cu files.
      hdrs: public headers (host-includable: no CUDA types unless guarded).
      deps: cc_library deps whose headers the .cu files include.
      copts: extra nvcc flags.
      src_copts: more nvcc flags for single sources, by file name.
      visibility: as for cc_library.
      **kwargs: passed to the cc_library.
    """
    names = [s.split(":")[-1].split("/")[-1] for s in srcs]
    for f in src_copts:
        if f not in names:
            fail("src_copts names %s, which is not among the srcs of %s" % (f, name))
    _cuda_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        src_copts = src_copts,
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart_static"],
        linkstatic = 1,
        visibility = visibility,
        **kwargs
    )
