//! 16-bit float storage types for F16 and BF16 tensors: bit containers with conversions, no
//! arithmetic. Both are `#[repr(transparent)]` over `u16`, so a `&[Bf16]` is exactly the
//! memory libte reads.

use std::fmt;

/// bfloat16: the top half of an f32 (8 exponent bits, 7 mantissa bits).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
#[allow(non_camel_case_types)]
pub struct Bf16(pub u16);

impl Bf16 {
    /// The raw bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// From raw bits.
    pub const fn from_bits(bits: u16) -> Bf16 {
        Bf16(bits)
    }

    /// Rounds to nearest even, as libte's casts do; NaN stays NaN (quiet), infinities stay.
    pub fn from_f32(x: f32) -> Bf16 {
        let bits = x.to_bits();
        if x.is_nan() {
            return Bf16(((bits >> 16) as u16) | 0x0040);
        }
        let round = ((bits >> 16) & 1) + 0x7fff;
        Bf16((bits.wrapping_add(round) >> 16) as u16)
    }

    /// Exact.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl From<f32> for Bf16 {
    fn from(x: f32) -> Bf16 {
        Bf16::from_f32(x)
    }
}

impl From<Bf16> for f32 {
    fn from(x: Bf16) -> f32 {
        x.to_f32()
    }
}

impl fmt::Debug for Bf16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_f32(), f)
    }
}

impl fmt::Display for Bf16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f32(), f)
    }
}

/// IEEE binary16 (5 exponent bits, 10 mantissa bits).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct F16(pub u16);

impl F16 {
    /// The raw bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// From raw bits.
    pub const fn from_bits(bits: u16) -> F16 {
        F16(bits)
    }

    /// Rounds to nearest even; overflow gives infinity; NaN stays NaN (quiet).
    pub fn from_f32(x: f32) -> F16 {
        let bits = x.to_bits();
        let sign = ((bits >> 16) & 0x8000) as u16;
        let exp = ((bits >> 23) & 0xff) as i32;
        let man = bits & 0x007f_ffff;
        if exp == 0xff {
            let payload = if man != 0 {
                0x0200 | (man >> 13) as u16
            } else {
                0
            };
            return F16(sign | 0x7c00 | payload);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            // Subnormal (or zero): value = r * 2^-24 with r = m * 2^(e - 14), m with its implicit 1.
            if e < -10 {
                return F16(sign);
            }
            let m = man | 0x0080_0000;
            let shift = (14 - e) as u32;
            let half = 1u32 << (shift - 1);
            let rem = m & ((1u32 << shift) - 1);
            let mut r = m >> shift;
            if rem > half || (rem == half && (r & 1) == 1) {
                r += 1; // may carry into the smallest normal: still the right encoding
            }
            return F16(sign | r as u16);
        }
        let mut r = ((e as u32) << 10) | (man >> 13);
        let rem = man & 0x1fff;
        if rem > 0x1000 || (rem == 0x1000 && (r & 1) == 1) {
            r += 1; // may carry into infinity: the right result for overflow
        }
        F16(sign | r as u16)
    }

    /// Exact.
    pub fn to_f32(self) -> f32 {
        let h = self.0;
        let sign = ((h & 0x8000) as u32) << 16;
        let exp = ((h >> 10) & 0x1f) as u32;
        let man = (h & 0x03ff) as u32;
        let bits = if exp == 0 {
            let magnitude = man as f32 * f32::from_bits(0x3380_0000); // 2^-24
            return if sign != 0 { -magnitude } else { magnitude };
        } else if exp == 0x1f {
            sign | 0x7f80_0000 | (man << 13)
        } else {
            sign | ((exp + 112) << 23) | (man << 13)
        };
        f32::from_bits(bits)
    }
}

impl From<f32> for F16 {
    fn from(x: f32) -> F16 {
        F16::from_f32(x)
    }
}

impl From<F16> for f32 {
    fn from(x: F16) -> f32 {
        x.to_f32()
    }
}

impl fmt::Debug for F16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_f32(), f)
    }
}

impl fmt::Display for F16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_f32(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_code() {
        for bits in 0..=u16::MAX {
            let h = F16(bits);
            let x = h.to_f32();
            if x.is_nan() {
                assert!(F16::from_f32(x).to_f32().is_nan());
            } else {
                assert_eq!(F16::from_f32(x), h, "code {:#06x} ({})", bits, x);
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        assert_eq!(F16::from_f32(1.0 + 1.0 / 2048.0).0, 0x3c00); // tie, to even
        assert_eq!(F16::from_f32(1.0 + 3.0 / 2048.0).0, 0x3c02); // tie, to even (up)
        assert_eq!(F16::from_f32(65520.0).0, 0x7c00); // rounds past the max: infinity
        assert_eq!(F16::from_f32(65519.0).0, 0x7bff);
        assert_eq!(F16::from_f32(f32::from_bits(0x3300_0000)).0, 0); // 2^-25: tie to 0
        assert_eq!(F16::from_f32(f32::from_bits(0x3300_0001)).0, 1);
    }

    #[test]
    fn bf16_round_trips_and_rounds() {
        for bits in 0..=u16::MAX {
            let b = Bf16(bits);
            let x = b.to_f32();
            if !x.is_nan() {
                assert_eq!(Bf16::from_f32(x), b);
            } else {
                assert!(Bf16::from_f32(x).to_f32().is_nan());
            }
        }
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f80_8000)).0, 0x3f80); // tie, to even
        assert_eq!(Bf16::from_f32(f32::from_bits(0x3f81_8000)).0, 0x3f82);
        assert_eq!(Bf16::from_f32(f32::MAX).0, 0x7f80); // rounds to infinity
    }
}
