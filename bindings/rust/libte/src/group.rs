//! `Group`: a process group that autocast scopes all-reduce amaxes over (`te_group`), and
//! `NcclId`, the id NCCL ranks share to make one.

use std::fmt;
use std::os::raw::{c_char, c_void};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use libte_sys as sys;

use crate::error::{check, Error, Result, Status};

/// Bytes in an [`NcclId`] (`te_nccl_id`, as `ncclUniqueId`).
pub const NCCL_ID_BYTES: usize = std::mem::size_of::<sys::te_nccl_id>();

/// An NCCL unique id (`te_nccl_id`): 128 opaque bytes. One rank makes it with
/// [`nccl_unique_id`] and sends it to the others out of band (a socket, a file, the launcher's
/// store); every rank then passes it to [`Group::init_nccl`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclId([u8; NCCL_ID_BYTES]);

impl NcclId {
    /// The id received from another rank.
    pub fn from_bytes(bytes: &[u8; NCCL_ID_BYTES]) -> NcclId {
        NcclId(*bytes)
    }

    /// The bytes to send to the other ranks.
    pub fn as_bytes(&self) -> &[u8; NCCL_ID_BYTES] {
        &self.0
    }

    fn to_raw(self) -> sys::te_nccl_id {
        let mut raw = sys::te_nccl_id::default();
        for (dst, &src) in raw.internal.iter_mut().zip(self.0.iter()) {
            *dst = src as c_char;
        }
        raw
    }

    fn from_raw(raw: &sys::te_nccl_id) -> NcclId {
        let mut bytes = [0u8; NCCL_ID_BYTES];
        for (dst, &src) in bytes.iter_mut().zip(raw.internal.iter()) {
            *dst = src as u8;
        }
        NcclId(bytes)
    }
}

impl fmt::Debug for NcclId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first bytes are enough to tell ids apart in a log.
        f.write_str("NcclId(")?;
        for b in &self.0[..8] {
            write!(f, "{:02x}", b)?;
        }
        f.write_str("..)")
    }
}

/// `te_nccl_get_unique_id`: a new NCCL id, to make on one rank and share with the others.
/// Errors: `Unsupported` where libte has no NCCL or no usable CUDA device; `Nccl` when NCCL
/// fails.
pub fn nccl_unique_id() -> Result<NcclId> {
    let mut raw = sys::te_nccl_id::default();
    check(unsafe { sys::te_nccl_get_unique_id(&mut raw) })?;
    Ok(NcclId::from_raw(&raw))
}

/// The `te_group`, shared by the [`Group`] and every context whose autocast scopes used it.
///
/// libte keeps plain pointers to a scope's group after the scope ends: the enclosing pass
/// reduces the scope's forward amaxes when its outermost recording scope ends, backward
/// contexts saved in the scope reduce their gradients' amaxes over it, and so do the context's
/// pending backward buckets. So `te_group_destroy` ("every context must be done with the
/// group") runs only when the `Group` and all those contexts (each kept alive by its layers and
/// backward contexts) are gone: each holds an `Arc` of this.
pub(crate) struct GroupHandle {
    raw: NonNull<sys::te_group>,
    id: u64,
    /// More than one rank: reductions over it call into NCCL.
    multi_rank: bool,
    /// Held by a context, for a multi-rank group, around each libte call that may all-reduce
    /// over the group (see `Context::reducing`): NCCL communicators are not thread-safe, and
    /// te_group_abort must not run during such a call.
    reducing: Mutex<()>,
}

// Send: a te_group is a heap object with no thread affinity; it is destroyed (Drop, the last
// reference) when nothing else can use it. Sync: it is read-only after creation (te.h: "Groups
// are read-only after creation"): its id, rank and size never change. What does touch shared
// state, NCCL's communicator, goes through `reducing`: contexts on different threads reducing
// over one group take turns, and `Group::abort` (whose `te_group_abort` is made for another
// thread, but not during a reduction) runs only while no context is inside such a call.
unsafe impl Send for GroupHandle {}
unsafe impl Sync for GroupHandle {}

impl GroupHandle {
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn raw(&self) -> *mut sys::te_group {
        self.raw.as_ptr()
    }

    /// The turn of a context about to make a call that may reduce over this group; `None` for
    /// a single-rank group, whose reductions are no-ops.
    pub(crate) fn lock_reductions(&self) -> Option<MutexGuard<'_, ()>> {
        if self.multi_rank {
            // Nothing panics while holding it; a poisoned lock still serialises.
            Some(self.reducing.lock().unwrap_or_else(|e| e.into_inner()))
        } else {
            None
        }
    }
}

impl Drop for GroupHandle {
    fn drop(&mut self) {
        unsafe { sys::te_group_destroy(self.raw.as_ptr()) }
    }
}

/// A process group that autocast scopes all-reduce amaxes over (`te_group`): pass it in
/// [`AutocastOptions::group`](crate::AutocastOptions::group). Without one, a scope uses the
/// implicit single-rank group.
///
/// * [`Group::single`]: one rank; reductions are no-ops.
/// * [`Group::init_nccl`]: `nranks` ranks joined into a new NCCL communicator that the group
///   owns, from an [`NcclId`] made by [`nccl_unique_id`] on one rank.
/// * [`Group::from_nccl_comm`] (unsafe): a communicator of the program's own, borrowed.
///
/// NCCL groups need a CUDA device and a libte built with NCCL (`Unsupported` otherwise) and
/// reduce device memory, so they are for contexts on that device.
///
/// **Lifetime.** A scope borrows its group, so the group outlives the scope. libte also reduces
/// over the group after the scope has ended (the enclosing pass's scale update, backward
/// contexts saved in the scope, the context's pending backward buckets), which the borrow
/// checker cannot see: for that, every context a scope used the group on keeps it alive
/// itself. Dropping a `Group` therefore destroys the `te_group` (and an owned communicator) only
/// once those contexts are gone too.
///
/// **Threads.** `Send` and `Sync`: the group is read-only after creation, and [`abort`]
/// (`Group::abort`) is meant for a watchdog thread. Calls that may reduce over a multi-rank
/// group (an outermost scope's end, a backward, a current-scaling forward, `flush_backward`)
/// take turns per group, since NCCL communicators are not thread-safe; on every rank they must
/// still be issued in the same order, as any NCCL collective.
///
/// [`abort`]: Group::abort
pub struct Group {
    handle: Arc<GroupHandle>,
}

impl Group {
    /// `te_group_create_single`: a single-rank group (reductions are no-ops).
    pub fn single() -> Result<Group> {
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_group_create_single(&mut raw) })?;
        Group::own(raw, "te_group_create_single")
    }

    /// `te_group_init_nccl`: joins `nranks` ranks into a new NCCL communicator that the group
    /// owns. Collective: every rank calls it with the same `id`, and it returns when all have
    /// joined. The communicator is made on the calling thread's current CUDA device (select it
    /// first, e.g. `cudaSetDevice`), so use the group with a context on that device.
    ///
    /// `timeout`: how long to wait for every rank to join; when they have not all joined in time
    /// the call fails with `Nccl` instead of hanging. `None`: libte's default (10 minutes);
    /// `Some(Duration::ZERO)`: no limit. Rounded up to whole milliseconds; at most `i32::MAX`
    /// of them.
    ///
    /// Errors: `InvalidArgument` (naming the argument) for `nranks` 0, `rank >= nranks`, or a
    /// value over `i32::MAX`; `Unsupported` where libte has no NCCL or no usable CUDA device;
    /// `Nccl` when NCCL fails or the timeout passes.
    pub fn init_nccl(
        rank: usize,
        nranks: usize,
        id: &NcclId,
        timeout: Option<Duration>,
    ) -> Result<Group> {
        let to_i32 = |n: usize, name: &str| {
            i32::try_from(n).map_err(|_| {
                Error::invalid_argument(format!(
                    "Group::init_nccl: argument '{}': expected at most i32::MAX, got {}",
                    name, n
                ))
            })
        };
        let nranks = to_i32(nranks, "nranks")?;
        let rank = to_i32(rank, "rank")?;
        let raw_id = id.to_raw();
        let mut raw = ptr::null_mut();
        match timeout {
            None => {
                check(unsafe { sys::te_group_init_nccl(&mut raw, rank, nranks, &raw_id) })?;
            }
            Some(timeout) => {
                let mut opts = sys::te_group_nccl_options::default();
                let _ = unsafe { sys::te_group_nccl_options_init(&mut opts) };
                opts.struct_size = std::mem::size_of::<sys::te_group_nccl_options>();
                opts.timeout_ms = timeout_ms(timeout)?;
                check(unsafe {
                    sys::te_group_init_nccl_with_options(&mut raw, rank, nranks, &raw_id, &opts)
                })?;
            }
        }
        Group::own(raw, "te_group_init_nccl")
    }

    /// `te_group_create_nccl`: a group over a communicator the program owns (an `ncclComm_t`),
    /// which the group borrows and never destroys; rank and size come from NCCL. Amaxes are
    /// reduced on the context's stream, so the communicator must be on the context's device.
    /// Errors: `InvalidArgument` for NULL; `Unsupported` where libte has no NCCL or no usable
    /// CUDA device; `Nccl` when NCCL rejects the communicator.
    ///
    /// # Safety
    /// `comm` must be a valid `ncclComm_t` (or NULL, an error), and it must stay valid while
    /// libte may use it: until the group and every [`Context`](crate::Context) an autocast scope
    /// used the group on are dropped (a context lives while any of its layers or backward
    /// contexts does). While a libte call that reduces over the group runs, the program must
    /// not use the communicator on another thread (NCCL communicators are not thread-safe), nor
    /// destroy or abort it.
    pub unsafe fn from_nccl_comm(comm: *mut c_void) -> Result<Group> {
        let mut raw = ptr::null_mut();
        check(sys::te_group_create_nccl(&mut raw, comm))?;
        Group::own(raw, "te_group_create_nccl")
    }

    fn own(raw: *mut sys::te_group, func: &str) -> Result<Group> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::new(Status::Internal, format!("{} returned NULL", func)))?;
        let (id, size) = unsafe {
            (
                sys::te_group_id(raw.as_ptr()),
                sys::te_group_size(raw.as_ptr()),
            )
        };
        Ok(Group {
            handle: Arc::new(GroupHandle {
                raw,
                id,
                multi_rank: size > 1,
                reducing: Mutex::new(()),
            }),
        })
    }

    pub(crate) fn handle(&self) -> &Arc<GroupHandle> {
        &self.handle
    }

    /// A process-unique id: never reused, never 0 (0 names the implicit single-rank group).
    pub fn id(&self) -> u64 {
        self.handle.id
    }

    /// This process's rank in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        unsafe { sys::te_group_rank(self.handle.raw()) }.max(0) as usize
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        unsafe { sys::te_group_size(self.handle.raw()) }.max(0) as usize
    }

    /// `te_group_abort`, the way out for a rank whose peer failed: aborts the communicator the
    /// group owns (`ncclCommAbort`), which ends its reductions still running or waiting on the
    /// GPU for a rank that will never come, so that a [`Context::synchronize`] blocked on them
    /// returns. Meant for a watchdog thread while the owner waits. Afterwards every reduction
    /// over the group fails with `Nccl`: drop the group (and the contexts that used it) and
    /// make a new one. Aborting twice is a no-op.
    ///
    /// libte forbids aborting while a call that reduces over the group runs (an outermost
    /// scope's end, a backward, a current-scaling forward, `flush_backward`): when one is
    /// running on another thread, this returns `InvalidState` without aborting, and can be
    /// retried once it returned. Also `InvalidState` for a single-rank group (no communicator)
    /// and a borrowed one ([`from_nccl_comm`](Group::from_nccl_comm): abort it with
    /// `ncclCommAbort` yourself).
    ///
    /// [`Context::synchronize`]: crate::Context::synchronize
    pub fn abort(&self) -> Result<()> {
        let _turn = match self.handle.reducing.try_lock() {
            Ok(turn) => turn,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                return Err(Error::new(
                    Status::InvalidState,
                    "Group::abort: a call that reduces over the group is running on another \
                     thread, and libte forbids aborting during one; retry when it has returned",
                ))
            }
        };
        check(unsafe { sys::te_group_abort(self.handle.raw()) })
    }

    /// The raw handle, valid while `self` lives; do not destroy it. A scope opened with it
    /// through `libte-sys` directly is unknown to the context, which then neither keeps the
    /// group alive past `self` nor takes turns for it (see [`Group`]).
    pub fn as_ptr(&self) -> *mut sys::te_group {
        self.handle.raw()
    }
}

/// A timeout for `te_group_nccl_options`: whole milliseconds, rounded up (so that only zero
/// means "no limit"), at most `i32::MAX`.
fn timeout_ms(timeout: Duration) -> Result<i32> {
    let mut ms = timeout.as_millis();
    if timeout.subsec_nanos() % 1_000_000 != 0 {
        ms += 1;
    }
    i32::try_from(ms).map_err(|_| {
        Error::invalid_argument(format!(
            "Group::init_nccl: argument 'timeout': expected at most i32::MAX ms, got {} ms",
            ms
        ))
    })
}

impl fmt::Debug for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Group")
            .field("id", &self.id())
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AutocastOptions, Context};

    #[test]
    fn timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(timeout_ms(Duration::ZERO).unwrap(), 0);
        assert_eq!(timeout_ms(Duration::from_nanos(1)).unwrap(), 1);
        assert_eq!(timeout_ms(Duration::from_millis(1500)).unwrap(), 1500);
        assert_eq!(timeout_ms(Duration::from_micros(1500)).unwrap(), 2);
        let max = Duration::from_millis(i32::MAX as u64);
        assert_eq!(timeout_ms(max).unwrap(), i32::MAX);
        let err = timeout_ms(max + Duration::from_nanos(1)).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument);
        assert!(err.message().contains("'timeout'"), "{}", err);
    }

    #[test]
    fn abort_waits_its_turn_behind_a_reduction() {
        // A multi-rank group needs NCCL and GPUs; the turn-taking is the crate's own, so check
        // it with a single-rank te_group marked multi-rank.
        let mut raw = ptr::null_mut();
        check(unsafe { sys::te_group_create_single(&mut raw) }).unwrap();
        let group = Group {
            handle: Arc::new(GroupHandle {
                raw: NonNull::new(raw).unwrap(),
                id: unsafe { sys::te_group_id(raw) },
                multi_rank: true,
                reducing: Mutex::new(()),
            }),
        };
        let mut ctx = Context::cpu().unwrap();
        drop(
            ctx.autocast(&AutocastOptions::default().group(&group))
                .unwrap(),
        );
        // As if inside a libte call that reduces over the group: abort on another thread fails.
        let err = ctx.reducing(|_| {
            std::thread::scope(|s| s.spawn(|| group.abort().unwrap_err()).join().unwrap())
        });
        assert_eq!(err.status(), Status::InvalidState);
        assert!(err.message().starts_with("Group::abort: "), "{}", err);
        // Outside one, libte answers: a single-rank group has nothing to abort.
        let err = group.abort().unwrap_err();
        assert_eq!(err.status(), Status::InvalidState);
        assert!(err.message().starts_with("te_group_abort: "), "{}", err);
    }
}
