// The preload's C++ `operator new` / `operator delete` (crates/fallow-preload/src/cxx.rs):
// objects of every small size through new / new[] / delete / delete[] and the sized deletes,
// contents kept; a request no allocator can serve throws std::bad_alloc (the C++ runtime's
// `operator new`, reached from the preload's, throws it), and the new-handler is called first.
// Prints "ok" and exits 0.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

static int handler_calls = 0;

static void handler() {
    handler_calls++;
    std::set_new_handler(nullptr);
}

int main() {
    std::vector<char *> v;
    for (size_t i = 0; i < 20000; i++) {
        size_t n = 1 + (i * 7919) % 20000;
        char *p = (i & 1) ? new char[n] : static_cast<char *>(::operator new(n));
        memset(p, (int)(i & 0xff), n);
        v.push_back(p);
    }
    for (size_t i = 0; i < v.size(); i++) {
        size_t n = 1 + (i * 7919) % 20000;
        if (v[i][0] != (char)(i & 0xff) || v[i][n - 1] != (char)(i & 0xff)) {
            fprintf(stderr, "object %zu lost its contents\n", i);
            return 1;
        }
        if (i & 1) {
            if (i & 2) delete[] v[i]; else ::operator delete[](v[i], n);
        } else {
            if (i & 2) ::operator delete(v[i]); else ::operator delete(v[i], n);
        }
    }
    int *z = new int[0];
    if (z == nullptr) return 1;
    delete[] z;
    bool thrown = false;
    std::set_new_handler(handler);
    try {
        volatile size_t huge = (size_t)1 << 62;
        char *p = new char[huge];
        p[0] = 1;
    } catch (const std::bad_alloc &) {
        thrown = true;
    }
    if (!thrown || handler_calls != 1) {
        fprintf(stderr, "bad_alloc thrown: %d, new-handler calls: %d\n", thrown, handler_calls);
        return 1;
    }
    char *q = new (std::nothrow) char[(size_t)1 << 62];
    if (q != nullptr) return 1;
    puts("ok");
    return 0;
}
