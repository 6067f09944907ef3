"""A worker's batch to the main process through shared memory the worker reuses, and
page-locked buffers for the copy to the device.
"""
