//! BTF-defined maps, pinned by name.
//!
//! A map defined this way (in the `.maps` section, libbpf's convention) carries the BTF of its
//! key and value types, so the kernel knows their field names and `bpftool map dump` prints
//! `{"key": {"sandbox": 7, "generation": 1, "addr": …}, "value": {…}}` instead of bytes.
//! aya-ebpf has BTF maps, but without the `pinning` member svcd needs (the fence's maps are
//! pinned by name and reused across svcd restarts, so the fence fails closed), so the fence
//! defines its own: the same layout as libbpf's `__uint(type, …)`, `__type(key, …)`,
//! `__type(value, …)`, `__uint(max_entries, …)`, `__uint(map_flags, …)`,
//! `__uint(pinning, LIBBPF_PIN_BY_NAME)` definition, read by aya-obj when svcd loads the object.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::bpf_map_type,
    helpers::{bpf_map_lookup_elem, bpf_map_update_elem, bpf_ringbuf_output},
};

/// libbpf's `LIBBPF_PIN_BY_NAME`.
const PIN_BY_NAME: usize = 1;

/// One map definition: every member is a pointer whose pointee's type (or array length)
/// carries the value, never dereferenced.
#[repr(C)]
pub struct Map<const TYPE: usize, K, V, const MAX: usize, const FLAGS: usize> {
    r#type: *const [i32; TYPE],
    key: *const K,
    value: *const V,
    max_entries: *const [i32; MAX],
    map_flags: *const [i32; FLAGS],
    pinning: *const [i32; PIN_BY_NAME],
}

// SAFETY: the members are null placeholders the loader reads from BTF; nothing in Rust
// dereferences them, and the map's memory is the kernel's.
unsafe impl<const TYPE: usize, K, V, const MAX: usize, const FLAGS: usize> Sync
    for Map<TYPE, K, V, MAX, FLAGS>
{
}

impl<const TYPE: usize, K, V, const MAX: usize, const FLAGS: usize> Default
    for Map<TYPE, K, V, MAX, FLAGS>
{
    fn default() -> Self {
        Self::new()
    }
}

impl<const TYPE: usize, K, V, const MAX: usize, const FLAGS: usize> Map<TYPE, K, V, MAX, FLAGS> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
            pinning: ptr::null(),
        }
    }

    #[inline(always)]
    fn as_ptr(&self) -> *mut c_void {
        ptr::from_ref(self).cast_mut().cast()
    }

    /// A pointer to the value of `key`, if present.
    #[inline(always)]
    pub fn get_ptr_mut(&self, key: &K) -> Option<*mut V> {
        // SAFETY: a map definition the loader relocated and a key of the map's key type.
        let p = unsafe { bpf_map_lookup_elem(self.as_ptr(), ptr::from_ref(key).cast()) };
        (!p.is_null()).then_some(p.cast())
    }

    /// The value of `key`, if present.
    ///
    /// # Safety
    /// For hash maps the entry may be replaced or freed by a concurrent update while the
    /// reference lives: use it only for values written once (or read field by field).
    #[inline(always)]
    pub unsafe fn get(&self, key: &K) -> Option<&V> {
        // SAFETY: see above; the kernel's pointer is valid for the program's run.
        self.get_ptr_mut(key).map(|p| unsafe { &*p })
    }

    /// Insert or replace `key`'s value (`flags`: `BPF_ANY`, `BPF_NOEXIST`, `BPF_EXIST`).
    #[inline(always)]
    pub fn insert(&self, key: &K, value: &V, flags: u64) -> Result<(), i64> {
        // SAFETY: as for `get_ptr_mut`; the value is of the map's value type.
        let rc = unsafe {
            bpf_map_update_elem(
                self.as_ptr(),
                ptr::from_ref(key).cast(),
                ptr::from_ref(value).cast(),
                flags,
            )
        };
        if rc == 0 { Ok(()) } else { Err(rc) }
    }
}

/// A ring buffer of `V` records (`BYTES` long). Only its type, size and pinning are in the
/// definition: the kernel takes no key or value size for a ring buffer.
#[repr(C)]
pub struct RingBuf<V, const BYTES: usize> {
    r#type: *const [i32; RINGBUF],
    max_entries: *const [i32; BYTES],
    pinning: *const [i32; PIN_BY_NAME],
    record: core::marker::PhantomData<V>,
}

// SAFETY: as for `Map`.
unsafe impl<V, const BYTES: usize> Sync for RingBuf<V, BYTES> {}

impl<V, const BYTES: usize> Default for RingBuf<V, BYTES> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V, const BYTES: usize> RingBuf<V, BYTES> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            max_entries: ptr::null(),
            pinning: ptr::null(),
            record: core::marker::PhantomData,
        }
    }

    /// Copy `data` into the ring buffer (dropped when it is full).
    #[inline(always)]
    pub fn output(&self, data: &V, flags: u64) -> Result<(), i64> {
        // SAFETY: a ring buffer definition and a readable value of its record type.
        let rc = unsafe {
            bpf_ringbuf_output(
                ptr::from_ref(self).cast_mut().cast(),
                ptr::from_ref(data).cast_mut().cast(),
                size_of::<V>() as u64,
                flags,
            )
        };
        if rc < 0 { Err(rc) } else { Ok(()) }
    }
}

const HASH: usize = bpf_map_type::BPF_MAP_TYPE_HASH as usize;
const LRU_HASH: usize = bpf_map_type::BPF_MAP_TYPE_LRU_HASH as usize;
const ARRAY: usize = bpf_map_type::BPF_MAP_TYPE_ARRAY as usize;
const PERCPU_ARRAY: usize = bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY as usize;
const LPM_TRIE: usize = bpf_map_type::BPF_MAP_TYPE_LPM_TRIE as usize;
const RINGBUF: usize = bpf_map_type::BPF_MAP_TYPE_RINGBUF as usize;
/// The kernel requires LPM tries to be made without preallocation.
const NO_PREALLOC: usize = aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize;

pub type HashMap<K, V, const MAX: usize> = Map<HASH, K, V, MAX, 0>;
pub type LruHashMap<K, V, const MAX: usize> = Map<LRU_HASH, K, V, MAX, 0>;
pub type Array<V, const MAX: usize> = Map<ARRAY, u32, V, MAX, 0>;
pub type PerCpuArray<V, const MAX: usize> = Map<PERCPU_ARRAY, u32, V, MAX, 0>;
pub type LpmTrie<K, V, const MAX: usize> = Map<LPM_TRIE, LpmKey<K>, V, MAX, NO_PREALLOC>;

/// An LPM trie key: the prefix length in bits, then the data (the kernel's
/// `struct bpf_lpm_trie_key_u8` layout).
#[repr(C, packed)]
#[derive(Clone, Copy)]
pub struct LpmKey<K> {
    pub prefix_len: u32,
    pub data: K,
}
