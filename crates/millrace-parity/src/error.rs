//! Why a parity call was refused.

/// A call whose strips do not describe a stripe the code can compute or rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParityError {
    TooManyMissing,
    BadIndex,
    LengthMismatch,
}

impl std::fmt::Display for ParityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ParityError::TooManyMissing => {
                "More than two strips of the stripe are missing; RAID6 can rebuild at most two."
            }
            ParityError::BadIndex => {
                "A missing strip's index lies outside the stripe, or the stripe is not 1 to 255 \
                 data strips followed by P and Q."
            }
            ParityError::LengthMismatch => "The strips of the stripe differ in length.",
        })
    }
}

impl std::error::Error for ParityError {}
