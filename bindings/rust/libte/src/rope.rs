//! Rotary position embedding (`te_rope_forward` / `te_rope_backward`), TE's fused RoPE, as
//! methods of [`Context`].

use std::ptr;

use libte_sys as sys;

use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::tensor::{TensorView, TensorViewMut};

/// RoPE's options (`te_rope_options`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeOptions {
    /// The features of each head that rotate: 0 (the default) means all (`head_dim`); else
    /// even, in 2..=head_dim. The others are copied.
    pub rot_dim: usize,
    /// Pairs `(2k, 2k+1)` (GPT-J) instead of `(k, k + rot_dim/2)` (GPT-NeoX, the default).
    pub interleaved: bool,
}

impl Default for RopeOptions {
    /// libte's defaults (`te_rope_options_init`).
    fn default() -> RopeOptions {
        let mut raw = sys::te_rope_options::default();
        let _ = unsafe { sys::te_rope_options_init(&mut raw) };
        RopeOptions {
            rot_dim: raw.rot_dim.max(0) as usize,
            interleaved: raw.interleaved != 0,
        }
    }
}

impl RopeOptions {
    /// libte's defaults.
    pub fn new() -> RopeOptions {
        RopeOptions::default()
    }

    fn to_raw(self, func: &str) -> Result<sys::te_rope_options> {
        let mut raw = sys::te_rope_options::default();
        check(unsafe { sys::te_rope_options_init(&mut raw) })?;
        raw.struct_size = std::mem::size_of::<sys::te_rope_options>();
        raw.rot_dim = i32::try_from(self.rot_dim).map_err(|_| {
            Error::invalid_argument(format!(
                "{}: argument 'opts.rot_dim': expected at most i32::MAX, got {}",
                func, self.rot_dim
            ))
        })?;
        raw.interleaved = self.interleaved as i32;
        Ok(raw)
    }
}

fn opt_view(t: Option<&TensorView<'_>>) -> *const sys::te_tensor {
    t.map_or(ptr::null(), |t| t.as_raw())
}

impl Context {
    /// RoPE forward: `y` = x with the first `rot_dim` features of every head rotated by the
    /// angles `freqs[p, k]` (F32 `[positions, rot_dim / 2]`) of each token's position p in
    /// its sequence. x: BSHD `[batch, seq, heads, head_dim]` (`cu_seqlens` `None`) or THD
    /// `[tokens, heads, head_dim]` with `cu_seqlens` I32 `[batch + 1]`; y like x. Errors:
    /// `InvalidArgument` (shapes, dtypes, rot_dim odd or above head_dim, positions beyond
    /// freqs, bad offsets).
    pub fn rope_forward(
        &self,
        opts: &RopeOptions,
        x: &TensorView<'_>,
        freqs: &TensorView<'_>,
        cu_seqlens: Option<&TensorView<'_>>,
        y: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        let raw = opts.to_raw("Context::rope_forward")?;
        check(unsafe {
            sys::te_rope_forward(
                self.as_ptr(),
                &raw,
                x.as_raw(),
                freqs.as_raw(),
                opt_view(cu_seqlens),
                y.as_raw_mut(),
            )
        })
    }

    /// RoPE forward in place (y is x).
    pub fn rope_forward_inplace(
        &self,
        opts: &RopeOptions,
        x: &mut TensorViewMut<'_>,
        freqs: &TensorView<'_>,
        cu_seqlens: Option<&TensorView<'_>>,
    ) -> Result<()> {
        let raw = opts.to_raw("Context::rope_forward_inplace")?;
        let p = x.as_raw_mut();
        check(unsafe {
            sys::te_rope_forward(
                self.as_ptr(),
                &raw,
                p,
                freqs.as_raw(),
                opt_view(cu_seqlens),
                p,
            )
        })
    }

    /// RoPE backward, the inverse rotation: dx from dy (arguments as
    /// [`rope_forward`](Context::rope_forward)).
    pub fn rope_backward(
        &self,
        opts: &RopeOptions,
        dy: &TensorView<'_>,
        freqs: &TensorView<'_>,
        cu_seqlens: Option<&TensorView<'_>>,
        dx: &mut TensorViewMut<'_>,
    ) -> Result<()> {
        let raw = opts.to_raw("Context::rope_backward")?;
        check(unsafe {
            sys::te_rope_backward(
                self.as_ptr(),
                &raw,
                dy.as_raw(),
                freqs.as_raw(),
                opt_view(cu_seqlens),
                dx.as_raw_mut(),
            )
        })
    }

    /// RoPE backward in place (dx is dy).
    pub fn rope_backward_inplace(
        &self,
        opts: &RopeOptions,
        dy: &mut TensorViewMut<'_>,
        freqs: &TensorView<'_>,
        cu_seqlens: Option<&TensorView<'_>>,
    ) -> Result<()> {
        let raw = opts.to_raw("Context::rope_backward_inplace")?;
        let p = dy.as_raw_mut();
        check(unsafe {
            sys::te_rope_backward(
                self.as_ptr(),
                &raw,
                p,
                freqs.as_raw(),
                opt_view(cu_seqlens),
                p,
            )
        })
    }
}
