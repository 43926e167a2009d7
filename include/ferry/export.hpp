// Marks what libferry.so exports: the library is built with hidden symbols, so only the
// public API is visible to (and can clash with) the application. Vocabulary header: no
// dependencies, every layer may include it.
#pragma once

#define FERRY_API __attribute__((visibility("default")))
