"""What people and scripts see: progress, show, report, export."""
