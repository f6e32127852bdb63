//! Gemma 3's pan-and-scan: how many extra crops an image gets.

use super::config::PanAndScan;

// === impl PanAndScan ===

impl PanAndScan {
    /// The number of crops `Gemma3ImageProcessor.pan_and_scan` cuts (0: none), with its float
    /// steps: `floor(w / h + 0.5)` crops along the long side, at most `w / min_crop_size`,
    /// clamped to `[2, max_num_crops]`, and none if a crop would be under `min_crop_size`.
    pub(crate) fn crops(&self, width: u32, height: u32) -> u32 {
        let (long, short) = if width >= height {
            (width, height)
        } else {
            (height, width)
        };
        let (long_f, short_f) = (f64::from(long), f64::from(short));
        if long_f / short_f < self.min_ratio_to_activate {
            return 0;
        }
        let by_ratio = (long_f / short_f + 0.5).floor() as u32;
        let by_size = (long_f / f64::from(self.min_crop_size)).floor() as u32;
        let along = by_ratio.min(by_size).max(2).min(self.max_num_crops);
        if along == 0 {
            return 0;
        }
        let crop_long = (long_f / f64::from(along)).ceil() as u32;
        if crop_long.min(short) < self.min_crop_size {
            return 0;
        }
        along
    }
}
