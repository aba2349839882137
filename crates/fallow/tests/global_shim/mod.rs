//! The process-wide `FallowAlloc` of a test binary that makes fallow its global allocator:
//! `fallow_global!(config)` defines it, made at the first request from `config` (not a constant
//! expression) with small objects on and the default page threshold of these tests (256 KiB);
//! making it allocates nothing.

#[macro_export]
macro_rules! fallow_global {
    ($config:expr) => {
        struct Global(std::sync::OnceLock<fallow::FallowAlloc>);

        impl Global {
            fn get(&self) -> &fallow::FallowAlloc {
                self.0.get_or_init(|| fallow::FallowAlloc::with_config(256 << 10, $config))
            }
        }

        // SAFETY: every call is passed on unchanged to one `FallowAlloc`, itself a `GlobalAlloc`.
        unsafe impl std::alloc::GlobalAlloc for Global {
            unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
                // SAFETY: the caller's contract, passed on.
                unsafe { self.get().alloc(l) }
            }
            unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
                // SAFETY: as above.
                unsafe { self.get().alloc_zeroed(l) }
            }
            unsafe fn dealloc(&self, p: *mut u8, l: std::alloc::Layout) {
                // SAFETY: as above.
                unsafe { self.get().dealloc(p, l) }
            }
            unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, n: usize) -> *mut u8 {
                // SAFETY: as above.
                unsafe { self.get().realloc(p, l, n) }
            }
        }

        #[global_allocator]
        static A: Global = Global(std::sync::OnceLock::new());
    };
}
