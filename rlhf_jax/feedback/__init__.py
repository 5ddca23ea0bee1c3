"""People in the loop: clips, the label store and the labeling web app."""
