#pragma once
// RDMAKIT_TSAN is defined when ThreadSanitizer instruments this translation
// unit (GCC says so with __SANITIZE_THREAD__, Clang with __has_feature), and
// then the annotations that hide a deliberate race from it are declared: the
// bytes a peer reads or writes outside the C++ memory model (a NIC's DMA, the
// tcp provider's progress thread) are ordered by completions or checksums,
// not by atomics TSan could see.
#if defined(__SANITIZE_THREAD__)
#define RDMAKIT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMAKIT_TSAN 1
#endif
#endif

#ifdef RDMAKIT_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
#endif
