"""Training the extraction detector (`extract.Detector`): settings (`config`), losses, the loop and its
evaluation."""
