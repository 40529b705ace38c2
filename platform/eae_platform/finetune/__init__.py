"""Task fine-tuning of a pretrained EaE model: closed-book QA (`qa`), its Ray Tune sweeps
(`sweep`), and side-by-side comparisons of MLflow runs (`compare`)."""
