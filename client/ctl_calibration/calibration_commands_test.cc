#include "client/ctl_calibration/calibration_commands.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/ctl_calibration/cli_flags.h"
#include "gtest/gtest.h"
#include "kernels/calibration/scores.h"
#include "kernels/io/json.h"
#include "kernels/layout/layout_file.h"

namespace statecache {
namespace {

using absl::StatusCode;

int RunCmd(int (*cmd)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return cmd(static_cast<int>(argv.size()), argv.data());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr char kSmall[] =
    "--synthetic=arch=kda,layers=1,h_v=2,d_k=32,d_v=32,docs=4,tokens=64,domains=2";

TEST(CliFlagsTest, ParsesAndRejects) {
  std::vector<std::string> args = {"cmd", "--a=1", "--b", "2", "--flag"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  auto f = CliFlags::Parse(5, argv.data(), {"a", "b"}, {"flag"});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->GetInt("a", 0), 1);
  EXPECT_EQ(f->Get("b", ""), "2");
  EXPECT_TRUE(f->Has("flag"));
  EXPECT_EQ(f->GetDouble("a", 0).value(), 1.0);
  EXPECT_EQ(*f->GetInt("missing", 7), 7);
  EXPECT_EQ(CliFlags::Parse(5, argv.data(), {"a"}, {"flag"}).status().code(),
            StatusCode::kInvalidArgument);  // unknown --b
  std::vector<std::string> pos = {"cmd", "positional"};
  std::vector<char*> pv = {pos[0].data(), pos[1].data()};
  EXPECT_EQ(CliFlags::Parse(2, pv.data(), {}, {}).status().code(), StatusCode::kInvalidArgument);
}

TEST(CliFlagsTest, KebabCaseIsADeprecatedAlias) {
  CliFlags::Spec spec;
  spec.value_flags = {"sample_every"};
  spec.bool_flags = {"no_progress", "help"};
  auto f = CliFlags::Parse({"--sample-every=4", "--no-progress"}, spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f->GetInt("sample_every", 8), 4);
  EXPECT_TRUE(f->Has("no_progress"));
  ASSERT_EQ(f->warnings().size(), 2u);
  EXPECT_EQ(f->warnings()[0], "--sample-every is deprecated: use --sample_every");
  auto snake = CliFlags::Parse({"--sample_every=4"}, spec);
  ASSERT_TRUE(snake.ok());
  EXPECT_TRUE(snake->warnings().empty());
}

TEST(CliFlagsTest, SuggestsTheClosestFlag) {
  CliFlags::Spec spec;
  spec.value_flags = {"server", "token_file"};
  spec.bool_flags = {"help"};
  auto f = CliFlags::Parse({"--servr=x"}, spec);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(f.status().message(), "unknown flag --servr (did you mean '--server'?) (see --help)");
  auto kebab = CliFlags::Parse({"--token-fil=x"}, spec);
  EXPECT_EQ(kebab.status().message(),
            "unknown flag --token-fil (did you mean '--token_file'?) (see --help)");
  EXPECT_EQ(CliFlags::Parse({"--zzzzzz"}, spec).status().message(),
            "unknown flag --zzzzzz (see --help)");
  EXPECT_EQ(ClosestMatch("stauts", {"status", "models", "drop"}), "status");
  EXPECT_EQ(ClosestMatch("xyz", {"status", "models"}), "");
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
}

TEST(CliFlagsTest, HelpPositionalAndRest) {
  CliFlags::Spec spec;
  spec.value_flags = {"server"};
  spec.bool_flags = {"help", "json"};
  spec.positional = true;
  auto f = CliFlags::Parse({"-h", "a", "--json", "b", "--", "--server"}, spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Has("help"));
  EXPECT_TRUE(f->Has("json"));
  EXPECT_EQ(f->positional(), (std::vector<std::string>{"a", "b", "--server"}));
  spec.positional = false;
  spec.stop_at_positional = true;
  auto g = CliFlags::Parse({"--server", "x:1", "status", "--json"}, spec);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->Get("server", ""), "x:1");
  EXPECT_FALSE(g->Has("json"));
  EXPECT_EQ(g->rest(), (std::vector<std::string>{"status", "--json"}));
}

TEST(CliFlagsTest, SyntheticSpec) {
  auto s = ParseSyntheticSpec("arch=kda,layers=2,h_v=4,d_k=64,docs=3");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->base.geometry.arch, Arch::kKda);
  EXPECT_EQ(s->base.geometry.h_qk, 4);  // kda: h_qk = h_v
  EXPECT_EQ(s->docs, 3);
  auto d = MakeSyntheticDocument(*s, 2);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->domain, "synthetic-2");
  EXPECT_EQ(d->source, "synthetic");
  EXPECT_EQ(ParseSyntheticSpec("layers=x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSyntheticSpec("colour=3").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseSyntheticSpec("d_v=48").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExpandTrajectoryPaths("/does/not/exist").status().code(), StatusCode::kNotFound);
}

TEST(CalibrationCommandsTest, CalibrateWritesALoadableLayoutAndJson) {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/layout.safetensors", json = dir + "/cal.json";
  ASSERT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", kSmall, "--format=damp-sr:8", "--out=" + out,
                                      "--json=" + json, "--no_progress"}),
            0);
  const ModelGeometry geo{Arch::kKda, 1, 2, 2, 32, 32, 0.0f};
  const FormatSpec spec{StateFormat::kDampSr, 8};
  auto lf = ReadLayoutFile(out, &geo, &spec);
  ASSERT_TRUE(lf.ok()) << lf.status();
  EXPECT_EQ(lf->info.at("selector"), "horizon");
  auto j = ParseJson(ReadAll(json));
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->Find("command")->string_value(), "calibrate");
  EXPECT_EQ(j->Find("format")->string_value(), "damp-sr:8");
  EXPECT_EQ(*j->Find("calibration")->Find("samples_per_head")->AsUint64(), 4u * 64 / 8);
  ASSERT_TRUE(j->Find("stability")->is_object());
  // The layout of another geometry is refused.
  const ModelGeometry other{Arch::kKda, 2, 2, 2, 32, 32, 0.0f};
  EXPECT_EQ(ReadLayoutFile(out, &other, &spec).status().code(), StatusCode::kInvalidArgument);
}

TEST(CalibrationCommandsTest, EvaluateJsonHasEverySection) {
  const std::string json = ::testing::TempDir() + "/eval.json";
  ASSERT_EQ(RunCmd(RunEvaluateCommand, {"evaluate", kSmall, "--heldout_docs=1", "--no_progress",
                                     "--json=" + json}),
            0);
  auto j = ParseJson(ReadAll(json));
  ASSERT_TRUE(j.ok()) << j.status();
  int formats = 0, selectors = 0, sweep = 0;
  for (const JsonValue& row : j->Find("rows")->array()) {
    const std::string section = row.Find("section")->string_value();
    formats += section == "formats";
    selectors += section == "selectors";
    sweep += section == "k_sweep";
    EXPECT_EQ(row.Find("layers")->size(), 1u);
  }
  EXPECT_EQ(formats, 11);
  EXPECT_EQ(selectors, 2 * kNumSelectors);
  EXPECT_EQ(sweep, 2 * 5);  // K_hi in {0, 4, 8, 16, 32} (<= d_k = 32), damp and damp-sr
}

TEST(CalibrationCommandsTest, UsageErrors) {
  EXPECT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", "--bogus"}), 2);
  EXPECT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", "--no_progress"}), 2);  // no input
  EXPECT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", kSmall, "--format=int8"}), 2);
  EXPECT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", kSmall, "--selector=best"}), 2);
  EXPECT_EQ(RunCmd(RunCalibrateCommand, {"calibrate", "--help"}), 0);
  EXPECT_EQ(RunCmd(RunEvaluateCommand, {"evaluate", "--help"}), 0);
}

}  // namespace
}  // namespace statecache
