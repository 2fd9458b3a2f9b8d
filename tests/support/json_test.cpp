// The project's one JSON writer (support/json.h), byte for byte, and read
// back by the project's one reader (nlohmann): every crossing a part writes
// with it is a document the other side parses.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "iprobe/support/json.h"

using iprobe::JsonWriter;

TEST(JsonWriter, WritesFieldsInTheOrderGivenByteForByte) {
    JsonWriter j;
    j.begin_object().field("name", "fib").field("calls", std::uint64_t{55}).field("depth", -3);
    j.field("share", 0.0123).field("whole", 2.0).field("on", true).field("functions", std::vector<std::string>{"a", "b"});
    j.field("none", std::vector<std::string>{}).key("nothing").null().key("raw").raw(R"({"x":[1]})");
    j.end_object();
    EXPECT_EQ(j.str(), R"({"name":"fib","calls":55,"depth":-3,"share":0.0123,"whole":2,"on":true,)"
                       R"("functions":["a","b"],"none":[],"nothing":null,"raw":{"x":[1]}})");
}

TEST(JsonWriter, WhatItWritesTheReaderReadsBackTheSame) {
    const std::vector<std::string> hostile = {"", "two\nlines\r\n\ttab", "\"quoted\" \\back\\", std::string("nul\0in", 6),
                                              "\x01\x1f control", "caf\xc3\xa9 \xe2\x82\xac"};
    JsonWriter j;
    j.begin_object().field("strings", hostile).field("max", std::numeric_limits<std::uint64_t>::max());
    j.field("min", std::numeric_limits<std::int64_t>::min()).field("third", 1.0 / 3).field("inf", std::numeric_limits<double>::infinity());
    j.end_object();
    const auto doc = nlohmann::json::parse(j.str());
    EXPECT_EQ(doc.at("strings").get<std::vector<std::string>>(), hostile);
    EXPECT_EQ(doc.at("max").get<std::uint64_t>(), std::numeric_limits<std::uint64_t>::max());
    EXPECT_EQ(doc.at("min").get<std::int64_t>(), std::numeric_limits<std::int64_t>::min());
    EXPECT_EQ(doc.at("third").get<double>(), 1.0 / 3);  // the shortest text that reads back exactly
    EXPECT_TRUE(doc.at("inf").is_null());                // JSON has no infinity
}
