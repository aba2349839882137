//! The flags of an allocation request: what the caller needs of the block beyond its size.

/// Allocation flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u32);

impl Flags {
    pub const NONE: Flags = Flags(0);
    /// The contents must read zero.
    pub const ZERO: Flags = Flags(1);
    /// Every page resident on return (`MADV_POPULATE_WRITE`, or a touch per page).
    pub const POPULATE: Flags = Flags(2);
    /// `mlock` the block (implies resident).
    pub const LOCK: Flags = Flags(4);

    #[inline]
    pub fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for Flags {
    type Output = Flags;
    fn bitor(self, o: Flags) -> Flags {
        Flags(self.0 | o.0)
    }
}
