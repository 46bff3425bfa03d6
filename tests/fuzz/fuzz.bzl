"""statecache_fuzzer: one libFuzzer target and its seed-corpus regression test."""

def statecache_fuzzer(name, srcs, deps):
    """Defines <name>_fuzz and <name>_corpus_test.

    <name>_fuzz is a libFuzzer binary under --config=fuzz (clang,
    -fsanitize=fuzzer,address,undefined); in the default gcc build it links a
    standalone main that runs the inputs given on its command line.
    <name>_corpus_test replays corpus/<name>/ in the default test run.
    """
    native.cc_binary(
        name = name + "_fuzz",
        testonly = True,
        srcs = srcs,
        deps = deps + select({
            ":fuzzing": [],
            "//conditions:default": [":standalone_main"],
        }),
        linkopts = select({
            ":fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
    )
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = srcs,
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/*"]),
        deps = deps + [":standalone_main"],
    )
