// EXPECT_MENTIONS(message, "part", ...): the message (an error's or a command's output) contains
// every part; each missing one is reported with the whole message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#define EXPECT_MENTIONS(msg, ...)                                                   \
  do {                                                                              \
    const std::string m_ = (msg);                                                   \
    for (const char* w_ : {__VA_ARGS__})                                            \
      EXPECT_NE(m_.find(w_), std::string::npos) << "'" << w_ << "' not in: " << m_; \
  } while (0)
